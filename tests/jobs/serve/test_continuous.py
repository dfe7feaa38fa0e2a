"""The continuous batch on the tiny Llama with a LoRA adapter switched on (in process, no server):
a greedy request that joins a batch mid-decode answers exactly what it answers alone and what
transformers' `generate` answers, and the request it joined is not changed by it; the static-cache
batch (the GPU's, run eagerly here) answers the same and lets nobody join."""
import threading

import pytest

from jobs.serve.engine import Engine
from jobs.serve.rows import Row, Sampling
from jobs.serve.scheduler import Generation, Scheduler


@pytest.fixture(scope="module")
def served(tiny_model):
    """(engine, tokenizer, generate(prompt, n)) on the tiny Llama with a random LoRA named "job0"."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), lora, adapter_name="job0").eval()
    tok = AutoTokenizer.from_pretrained(tiny_model)

    def generate(prompt, n):
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, len(prompt):], skip_special_tokens=True)

    return Engine(model), tok, generate


def ask(tok, question):
    return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                   return_dict=True)["input_ids"]


class Answer:
    """A request's text and the scheduler's step count when it ended; `first` is set at its first
    text and (when `hold`) waits until `go` is set, so a test can submit another request then."""

    def __init__(self, scheduler, hold=False):
        self.scheduler, self.hold, self.text, self.ended_at = scheduler, hold, "", None
        self.first, self.go, self.done = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, events):
        for event in events:
            if event[0] == "delta":
                self.text += event[2]
            elif event[0] == "end":
                self.ended_at = self.scheduler.steps
                self.done.set()
        if self.hold and not self.first.is_set():
            self.first.set()
            self.go.wait(10)


def request(engine_tok, prompt, max_tokens, sink):
    _, tok, _ = engine_tok
    row = Row(index=0, prompt=prompt, max_tokens=max_tokens, stop=[])
    return Generation("m", "job0", tok, [row], Sampling(temperature=0.0), sink)


def second_arrives_while_first_decodes(served, scheduler, first_ask, second_ask):
    """Submit the first request, hold it at its first token, submit the second, let both finish:
    (first, second) answers. `*_ask` = (prompt, max_tokens)."""
    first, second = Answer(scheduler, hold=True), Answer(scheduler)
    scheduler.submit(request(served, *first_ask, first))
    assert first.first.wait(60)            # the first request is decoding: the second arrives now
    scheduler.submit(request(served, *second_ask, second))
    first.go.set()
    assert first.done.wait(60) and second.done.wait(60)
    return first, second


def test_a_greedy_request_joined_mid_batch_answers_as_alone(served):
    engine, tok, generate = served
    long_prompt, short_prompt = ask(tok, "Who are you?"), ask(tok, "What is the capital of France?")
    scheduler = Scheduler(engine)
    try:
        alone = Answer(scheduler)
        scheduler.submit(request(served, short_prompt, 10, alone))
        assert alone.done.wait(60)
        first, joined = second_arrives_while_first_decodes(served, scheduler, (long_prompt, 24), (short_prompt, 10))
    finally:
        scheduler.stop()
    assert scheduler.batches == 2 and scheduler.joins == 1
    assert joined.text == alone.text == generate(short_prompt, 10)
    assert first.text == generate(long_prompt, 24)
    assert joined.ended_at < first.ended_at   # it left after its own 10 tokens, not at the batch's end


def test_the_static_batch_answers_the_same_and_nobody_joins_it(served):
    engine, tok, generate = served
    static = Engine(engine.model, batching="static")
    prompt = ask(tok, "What is the capital of France?")
    scheduler = Scheduler(static)
    try:
        first, second = second_arrives_while_first_decodes(served, scheduler, (prompt, 10), (prompt, 10))
    finally:
        scheduler.stop()
    assert first.text == second.text == generate(prompt, 10)
    assert scheduler.batches == 2 and scheduler.joins == 0 and second.ended_at > first.ended_at


def test_rows_join_the_static_cache_in_free_slots_and_answer_as_alone(served):
    """The GPU's batching (slots.py), its step run eagerly here: a request joined mid-batch answers
    what generate answers, and so does the request it joined."""
    engine, tok, generate = served
    slots = Engine(engine.model, batching="slots", slots=4)
    long_prompt, short_prompt = ask(tok, "Who are you?"), ask(tok, "What is the capital of France?")
    scheduler = Scheduler(slots)
    try:
        first, joined = second_arrives_while_first_decodes(served, scheduler, (long_prompt, 24), (short_prompt, 10))
    finally:
        scheduler.stop()
    assert scheduler.batches == 1 and scheduler.joins == 1 and joined.ended_at < first.ended_at
    assert joined.text == generate(short_prompt, 10) and first.text == generate(long_prompt, 24)


def test_a_finished_static_cache_batch_is_reused_for_the_next_request_and_expires(served, monkeypatch):
    """A chat's next message reuses the finished GPU batch (its captured graph) rewound to fit its longer
    prompt, and answers what generate answers; once the batch has waited IDLE_KEEP_S, a new one opens."""
    from jobs.serve import engine as engines

    engine, tok, generate = served
    monkeypatch.setattr(engines, "SLOT_ROOM", 64)   # the tiny model's 512 positions leave no room for 512
    slots = Engine(engine.model, batching="slots", slots=2)
    short_prompt = ask(tok, "Hi")
    long_prompt = ask(tok, "Tell me, in a few words, what the capital city of France is called?")
    assert len(long_prompt) > len(short_prompt) + 4   # the second prompt needs the rewind to a later column
    scheduler = Scheduler(slots)
    try:
        answers = []
        for prompt in (short_prompt, long_prompt):
            answers.append(Answer(scheduler))
            scheduler.submit(request(served, prompt, 8, answers[-1]))
            assert answers[-1].done.wait(60)
        assert (scheduler.batches, scheduler.reuses) == (1, 1)
        scheduler.keep_idle_s = 0.0
        again = Answer(scheduler)
        scheduler.submit(request(served, short_prompt, 8, again))
        assert again.done.wait(60)
    finally:
        scheduler.stop()
    assert (scheduler.batches, scheduler.reuses) == (2, 1)
    assert answers[0].text == again.text == generate(short_prompt, 8)
    assert answers[1].text == generate(long_prompt, 8)
