"""The scheduler without a model (a stand-in engine): requests that can share a batch do, a seeded
one runs alone, the bounded queue answers 429 through the API, and a row's streamed text never
shows what a stop string will cut."""
import threading

import httpx
import pytest

from jobs.serve.api import create_app
from jobs.serve.rows import Row, Sampling
from jobs.serve.scheduler import Generation, QueueFull, Scheduler
from jobs.serve.served import Served, ServedModel
from tests.asgi_call import run_coroutine


class HeldEngine:
    """Records each batch's rows; the first batch waits until `release` is set."""

    def __init__(self):
        self.batches, self.started, self.release = [], threading.Event(), threading.Event()

    def run(self, rows, sampling, adapter, tokenizer, on_column, cancelled):
        self.started.set()
        self.release.wait(10)
        self.batches.append([r.index for r in rows])
        for row in rows:
            row.finish_reason = "length"


def generation(sink, temperature=1.0, seed=None, index=0, model="m"):
    return Generation(model, None, None, [Row(index=index, prompt=[1], max_tokens=2, stop=[])],
                      Sampling(temperature=temperature, seed=seed), sink)


def test_waiting_requests_share_a_batch_by_model_and_sampling_and_a_seeded_one_runs_alone():
    engine, ended = HeldEngine(), threading.Semaphore(0)
    sink = lambda events: ended.release() if ("end",) in events else None   # noqa: E731
    scheduler = Scheduler(engine, max_waiting=8)
    try:
        scheduler.submit(generation(sink, index=0))          # runs at once, held
        assert engine.started.wait(10)
        for i, kw in enumerate([{}, {"temperature": 0.5}, {}, {"seed": 3}, {"model": "other"}], start=1):
            scheduler.submit(generation(sink, index=i, **kw))
        engine.release.set()
        assert all(ended.acquire(timeout=10) for _ in range(6))
    finally:
        scheduler.stop()
    assert engine.batches == [[0], [1, 3], [2], [4], [5]]


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
