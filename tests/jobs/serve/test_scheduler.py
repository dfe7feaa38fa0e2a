"""The scheduler without a model (a stand-in engine): requests that can share a batch do, a seeded
one runs alone, a request joins the running batch at the next step and leaves it when its own rows
are done (counted in decode steps, not wall time), the row limit and another model's request hold
joins back, the bounded queue answers 429 through the API, and a row's streamed text never shows
what a stop string will cut."""
import threading

import httpx
import pytest

from jobs.serve.api import create_app
from jobs.serve.rows import Row, Sampling
from jobs.serve.scheduler import Generation, QueueFull, Scheduler
from jobs.serve.served import Served, ServedModel
from tests.asgi_call import run_coroutine


class FakeBatch:
    """Every live row takes one token per admit/step and ends at its max_tokens."""

    can_join = True

    def __init__(self, engine):
        self.engine, self.rows = engine, []

    def admit(self, rows):
        if not self.engine.started.is_set():
            self.engine.started.set()
            self.engine.release.wait(10)
        self.engine.admitted.append([r.index for r in rows])
        self.rows += rows
        self._take(rows)

    def step(self):
        self._take(self.rows)

    @staticmethod
    def _take(rows):
        for row in rows:
            row.take(5, eos=set(), decode_text=lambda ids: "x" * len(ids))

    def retire(self):
        self.rows = [r for r in self.rows if not r.done]


class HeldEngine:
    """Records the rows each batch opens with (`batches`) and each admission (`admitted`); the first
    admission waits until `release` is set."""

    def __init__(self):
        self.batches, self.admitted = [], []
        self.started, self.release = threading.Event(), threading.Event()

    def open(self, rows, sampling, adapter, tokenizer):
        self.batches.append([r.index for r in rows])
        return FakeBatch(self)

    def can_join(self, batch, rows):
        return batch.can_join


def generation(sink, temperature=1.0, seed=None, index=0, model="m", max_tokens=2, n=1):
    rows = [Row(index=index, prompt=[1], max_tokens=max_tokens, stop=[]) for _ in range(n)]
    return Generation(model, None, None, rows, Sampling(temperature=temperature, seed=seed), sink)


def test_waiting_requests_share_a_batch_by_model_and_sampling_and_a_seeded_one_runs_alone():
    engine, ended = HeldEngine(), threading.Semaphore(0)
    sink = lambda events: ended.release() if ("end",) in events else None   # noqa: E731
    scheduler = Scheduler(engine, max_waiting=8)
    try:
        scheduler.submit(generation(sink, index=0, max_tokens=1))   # runs at once, held, then ends
        assert engine.started.wait(10)
        for i, kw in enumerate([{}, {"temperature": 0.5}, {}, {"seed": 3}, {"model": "other"}], start=1):
            scheduler.submit(generation(sink, index=i, **kw))
        engine.release.set()
        assert all(ended.acquire(timeout=10) for _ in range(6))
    finally:
        scheduler.stop()
    assert engine.batches == [[0], [1, 3], [2], [4], [5]] and scheduler.joins == 0


def ends_at_step(scheduler, ends, name):
    """A sink that records the scheduler's decode-step count when request `name` ends."""
    return lambda events: ends.__setitem__(name, scheduler.steps) if ("end",) in events else None


def wait_for_ends(ends: dict, count: int, timeout_s: float = 5.0) -> None:
    """Until `count` requests have ended (the assertions after it say which, and when)."""
    for _ in range(int(timeout_s / 0.05)):
        if len(ends) >= count:
            return
        threading.Event().wait(0.05)


def test_a_request_joins_the_running_batch_at_the_next_step_and_leaves_before_it_ends():
    engine, ends = HeldEngine(), {}
    scheduler = Scheduler(engine, max_waiting=8, max_batch_rows=2)
    try:
        scheduler.submit(generation(ends_at_step(scheduler, ends, "a"), index=0, max_tokens=8))
        assert engine.started.wait(10)                         # A is prefilling (held)
        for name, index in (("b", 1), ("c", 2)):               # B fits the free slot, C waits for one
            scheduler.submit(generation(ends_at_step(scheduler, ends, name), index=index, max_tokens=2))
        engine.release.set()
        wait_for_ends(ends, 3)
    finally:
        scheduler.stop()
    assert engine.batches == [[0]] and engine.admitted == [[0], [1], [2]]
    assert scheduler.batches == 1 and scheduler.joins == 2
    # B joined after A's first step and ended after its own 2 tokens, long before A's 8
    assert ends == {"b": 2, "c": 3, "a": 7}


def test_a_request_for_another_model_stops_later_joins_so_it_is_not_starved():
    engine, ends = HeldEngine(), {}
    scheduler = Scheduler(engine, max_waiting=8)
    try:
        scheduler.submit(generation(ends_at_step(scheduler, ends, "a"), index=0, max_tokens=4))
        assert engine.started.wait(10)
        scheduler.submit(generation(ends_at_step(scheduler, ends, "b"), index=1))
        scheduler.submit(generation(ends_at_step(scheduler, ends, "other"), index=2, model="other"))
        scheduler.submit(generation(ends_at_step(scheduler, ends, "late"), index=3))
        engine.release.set()
        wait_for_ends(ends, 4)
    finally:
        scheduler.stop()
    assert engine.batches == [[0], [2], [3]] and scheduler.joins == 1   # B joined; "late" waited its turn


def test_a_full_queue_answers_429_in_openai_shape():
    from tests.tiny import make_tokenizer
    engine = HeldEngine()
    scheduler = Scheduler(engine, max_waiting=1)
    tokenizer = make_tokenizer()
    served = Served(model=None, base_dir=None, context=64, models={"m": ServedModel("m", None, tokenizer, "x")})
    app = create_app(served, scheduler)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        scheduler.submit(generation(lambda e: None))        # running (held)
        assert engine.started.wait(10)
        scheduler.submit(generation(lambda e: None))        # waiting: the queue is full
        with pytest.raises(QueueFull):
            scheduler.submit(generation(lambda e: None))

        async def post():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
                return await http.post("/v1/chat/completions", json=body)

        answer = run_coroutine(post)
    finally:
        engine.release.set()
        scheduler.stop()
    assert answer.status_code == 429
    assert answer.json()["error"]["code"] == "queue_full" and "busy" in answer.json()["error"]["message"]


def test_streamed_text_holds_back_a_possible_stop_string():
    words = {1: "Paris", 2: " is", 3: " ni", 4: "ce.", 9: "!"}
    row = Row(index=0, prompt=[0], max_tokens=10, stop=["nice"])
    decode_text = lambda ids: "".join(words[i] for i in ids)   # noqa: E731
    sent = []
    for token in (1, 2, 3, 4, 9):
        row.take(token, eos={0}, decode_text=decode_text)
        sent.append(row.new_text())
    assert "".join(sent) == "Paris is " and row.finish_reason == "stop"
    assert "n" not in "".join(sent[:3])   # " ni" was held back until the stop string was settled


def test_a_row_ends_at_eos_or_max_tokens():
    row = Row(index=0, prompt=[0], max_tokens=2, stop=[])
    row.take(5, eos={7}, decode_text=lambda ids: "x" * len(ids))
    row.take(6, eos={7}, decode_text=lambda ids: "x" * len(ids))
    assert row.finish_reason == "length" and row.new_text() == "xx"
    eos_row = Row(index=0, prompt=[0], max_tokens=5, stop=[])
    eos_row.take(7, eos={7}, decode_text=lambda ids: "")
    assert eos_row.finish_reason == "stop" and eos_row.tokens == [7]
