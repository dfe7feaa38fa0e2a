"""`python -m jobs.serve` through the official `openai` client: the models listed, chat whole and
streamed, completions, two adapters in one process giving each its own answer (the tokens of
transformers' generate with that adapter), 8 concurrent clients sharing batches, and every bad input
answered 4xx with an OpenAI-style message; 401 without the key."""
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.jobs.serve.conftest import API_KEY

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MODELS = ("tiny-llama", "llama-job", "llama-job-b")


def chat(client, model, max_tokens=12, **kw):
    return client.chat.completions.create(model=model, messages=QUESTION, max_tokens=max_tokens,
                                          temperature=0, **kw)


@pytest.fixture(scope="module")
def reference(tiny_model, tiny_job, second_job):
    """Greedy answers of transformers' generate for base, job and job-b (one PeftModel, as served)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_job / "adapter")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), tiny_job / "adapter",
                                      adapter_name="a")
    model.load_adapter(second_job / "adapter", adapter_name="b")
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)

    def greedy():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    with torch.no_grad():
        with model.disable_adapter():
            answers = {"tiny-llama": greedy()}
        for name, adapter in (("llama-job", "a"), ("llama-job-b", "b")):
            model.set_adapter(adapter)
            answers[name] = greedy()
    return answers


def test_models_lists_the_base_and_each_job(client):
    assert sorted(m.id for m in client.models.list()) == sorted(MODELS)
    assert client.models.retrieve("llama-job").owned_by == "tiny-llama"


def test_each_model_answers_as_generate_does_with_its_own_adapter(client, reference):
    answers = {m: chat(client, m).choices[0].message.content for m in MODELS}
    assert answers == reference
    assert len(set(answers.values())) == 3   # the two adapters and the base really differ


def test_a_stream_gives_the_same_text_in_pieces_then_usage(client, reference):
    stream = chat(client, "llama-job-b", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == reference["llama-job-b"] and len([p for p in pieces if p]) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.completion_tokens <= 12 and chunks[-1].usage.prompt_tokens > 0


def test_completions_take_several_prompts_and_n(client):
    out = client.completions.create(model="llama-job", prompt=["The capital of", "Blue is"], n=2,
                                    max_tokens=5, temperature=0.8, top_p=0.9)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason in ("stop", "length") for c in out.choices)
    assert 0 < out.usage.completion_tokens <= 20
    streamed = client.completions.create(model="tiny-llama", prompt="Who are", max_tokens=4, stream=True)
    assert all(chunk.object == "text_completion" for chunk in streamed)


def test_a_stop_string_cuts_the_answer_and_a_seed_repeats_it(client, reference):
    text = reference["llama-job"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = chat(client, "llama-job", stop=[stop]).choices[0]
    assert cut.message.content == text[:text.index(stop)] and cut.finish_reason == "stop"
    seeded = [client.chat.completions.create(model="llama-job", messages=QUESTION, max_tokens=8, seed=11,
                                             temperature=1.0).choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_eight_concurrent_clients_share_batches_and_get_their_own_answers(client, server, reference):
    before = httpx.get(server.removesuffix("/v1") + "/health").json()["batches"]
    models = [MODELS[i % 3] for i in range(8)]
    with ThreadPoolExecutor(9) as pool:
        # a long answer first, so the 8 wait together for the next batches whatever the machine's load
        blocker = pool.submit(chat, client, "tiny-llama", max_tokens=300, stop=["never appears"])
        time.sleep(0.3)
        answers = list(pool.map(lambda m: chat(client, m).choices[0].message.content, models))
        blocker.result()
    assert answers == [reference[m] for m in models]
    batches = httpx.get(server.removesuffix("/v1") + "/health").json()["batches"] - before
    assert batches <= 5   # the blocker, then one batch per model (3), not one per request (9)


BAD = [
    ({"model": "nope", "messages": QUESTION}, 404, "model_not_found"),
    ({"model": "llama-job", "messages": QUESTION, "temperature": 3}, 400, "temperature"),
    ({"model": "llama-job", "messages": QUESTION, "top_p": 0}, 400, "top_p"),
    ({"model": "llama-job", "messages": QUESTION, "n": 0}, 400, "n"),
    ({"model": "llama-job", "messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "llama-job", "messages": QUESTION, "max_tokens": 100000}, 400, "context"),
    ({"model": "llama-job", "messages": [{"role": "user", "content": "Paris " * 600}]}, 400, "context"),
    ({"model": "llama-job", "messages": QUESTION, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": "llama-job", "messages": []}, 400, "messages"),
    ({"model": "llama-job", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ({"model": "llama-job", "messages": QUESTION, "presence_penalty": 1}, 400, "presence_penalty"),
    ({"model": "llama-job", "messages": QUESTION, "stream": "yes"}, 400, "stream"),
    ({"messages": QUESTION}, 400, "model"),
]


@pytest.mark.parametrize("body,status,names", BAD, ids=[b[2] for b in BAD])
def test_bad_input_is_a_4xx_with_a_message(server, body, status, names):
    answer = httpx.post(server + "/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                        timeout=60)
    error = answer.json()["error"]
    assert answer.status_code == status and names in (error["message"] + str(error["code"]) + str(error["param"]))
    assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in answer.text


def test_bad_json_and_bad_prompt_ids_are_400(server):
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    answer = httpx.post(server + "/chat/completions", content=b'{"model": "llama-job",', headers=headers)
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"]
    answer = httpx.post(server + "/completions", json={"model": "llama-job", "prompt": [1, 10 ** 9]},
                        headers=headers)
    assert answer.status_code == 400 and "vocabulary" in answer.json()["error"]["message"]


def test_the_openai_client_raises_its_own_errors(client, server):
    import openai
    with pytest.raises(openai.NotFoundError, match="not served here"):
        chat(client, "gpt-4o")
    with pytest.raises(openai.AuthenticationError, match="not valid"):
        openai.OpenAI(base_url=server, api_key="wrong", max_retries=0).models.list()
    answer = httpx.get(server + "/models")
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
