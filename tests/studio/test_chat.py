"""The chat engine on a real tiny Llama and a real LoRA adapter: streaming, base and tuned answered
together in one batch (PEFT's mixed adapter batch), seeding, the LRU cache and stopping a
generation whose reader went away."""
import pytest
import torch

from jobs.models.load import load_for_chat
from studio.chat import ChatEngine, Sampling, history_to_messages, message_text, render_prompt
from tests.tiny import make_tiny_model

GREEDY = Sampling(temperature=0.0, max_new_tokens=12)
PROMPT = [{"role": "user", "content": "Who are you?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model dir, adapter dir): the adapter's B matrices are random, so it changes the output."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("chat")
    model_dir = make_tiny_model(root / "tiny")
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(1)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"],
                                           init_lora_weights=False))
    peft.save_pretrained(root / "adapter")
    return str(model_dir), str(root / "adapter"), root


def final(chunks):
    texts = list(chunks)
    return texts


def test_history_to_messages_handles_gradio6_content():
    history = [
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "(loading)", "metadata": {"title": "notice"}},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "file", "file": {"path": "/x.png"}}]},
        {"role": "user", "content": "   "},
    ]
    assert history_to_messages(history, system="Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello"},
    ]
    assert message_text({"type": "text", "text": "x"}) == "x" and message_text(None) == ""


def test_sampling_kwargs():
    assert GREEDY.generate_kwargs() == {"do_sample": False, "max_new_tokens": 12}
    hot = Sampling(temperature=0.8, top_p=0.5, max_new_tokens=3).generate_kwargs()
    assert hot == {"do_sample": True, "temperature": 0.8, "top_p": 0.5, "max_new_tokens": 3}


def test_stream_grows_and_base_answer_is_the_plain_base_model(tiny):
    model_dir, adapter_dir, root = tiny
    engine = ChatEngine(root, loader=load_for_chat)
    tuned = final(engine.stream(model_dir, adapter_dir, PROMPT, GREEDY, use_adapter=True))
    assert len(tuned) > 1 and tuned[-1]
    assert all(b.startswith(a) for a, b in zip(tuned, tuned[1:]))  # cumulative, growing text
    base_via_switch = final(engine.stream(model_dir, adapter_dir, PROMPT, GREEDY, use_adapter=False))[-1]
    plain = final(engine.stream(model_dir, None, PROMPT, GREEDY))[-1]
    assert base_via_switch == plain
    assert tuned[-1] != plain


def test_base_and_tuned_in_one_batch_equal_their_separate_answers(tiny):
    """Greedy rows of the mixed batch (different prompt lengths, left-padded) answer exactly as
    each model alone, and both texts grow in the same steps."""
    model_dir, adapter_dir, root = tiny
    engine = ChatEngine(root, loader=load_for_chat)
    longer = [{"role": "user", "content": "Tell me a story about a quokka, please."}]
    tuned_alone = final(engine.stream(model_dir, adapter_dir, PROMPT, GREEDY, use_adapter=True))[-1]
    base_alone = final(engine.stream(model_dir, adapter_dir, longer, GREEDY, use_adapter=False))[-1]
    frames = list(engine.stream_batch(model_dir, adapter_dir, [PROMPT, longer], GREEDY, [True, False]))
    assert frames[-1] == [tuned_alone, base_alone] and tuned_alone != base_alone
    grown = [i for i, (a, b) in enumerate(zip(frames, frames[1:])) if b[0] != a[0] and b[1] != a[1]]
    assert len(grown) >= 3  # steps where both answers grew at once


def test_same_seed_same_sample(tiny):
    model_dir, _, root = tiny
    engine = ChatEngine(root, loader=load_for_chat)
    hot = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3)
    first = final(engine.stream(model_dir, None, PROMPT, hot))[-1]
    assert final(engine.stream(model_dir, None, PROMPT, hot))[-1] == first
    other = [final(engine.stream(model_dir, None, PROMPT, Sampling(1.0, 1.0, 16, seed)))[-1] for seed in (4, 5, 6)]
    assert any(text != first for text in other)


def test_prompt_uses_the_chat_template(tiny):
    model_dir, _, root = tiny
    _, tokenizer = ChatEngine(root, loader=load_for_chat).load(model_dir, None)
    text = render_prompt(tokenizer, PROMPT)
    assert text == "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"


def test_lru_cache_evicts_least_recent(tiny):
    model_dir, adapter_dir, root = tiny
    calls = []

    def loader(model, adapter, data_dir):
        calls.append((model, adapter))
        return load_for_chat(model, adapter, data_dir)

    engine = ChatEngine(root, loader=loader, capacity=2)
    engine.load(model_dir, None)
    engine.load(model_dir, None)
    assert calls == [(model_dir, None)]
    engine.load(model_dir, adapter_dir)
    engine.load(model_dir, None)  # now the most recent again
    assert len(calls) == 2 and engine.is_loaded(model_dir, adapter_dir)
    engine.load(str(make_tiny_model(root / "second", seed=1)), None)  # evicts the adapter pair
    assert engine.is_loaded(model_dir, None) and not engine.is_loaded(model_dir, adapter_dir)
    assert len(calls) == 3
    single = ChatEngine(root, loader=loader)  # the default keeps one model
    single.load(model_dir, None)
    single.load(model_dir, adapter_dir)
    assert not single.is_loaded(model_dir, None)


def test_closing_the_stream_stops_generation(tiny):
    model_dir, _, root = tiny
    lengths = []

    def loader(model, adapter, data_dir):
        loaded, tokenizer = load_for_chat(model, adapter, data_dir)
        loaded.generation_config.eos_token_id = None  # only max_new_tokens or our stop can end it
        generate = loaded.generate

        def recording_generate(**kwargs):
            out = generate(**kwargs)
            lengths.append(out.shape[1] - kwargs["input_ids"].shape[1])
            return out

        loaded.generate = recording_generate
        return loaded, tokenizer

    engine = ChatEngine(root, loader=loader)
    long = Sampling(temperature=1.0, max_new_tokens=400, seed=0)
    list(engine.stream(model_dir, None, PROMPT, Sampling(1.0, 1.0, 5, 0)))
    assert lengths == [5]
    stream = engine.stream(model_dir, None, PROMPT, long)
    next(stream), next(stream)
    stream.close()  # what Gradio does when the browser goes away
    assert engine._generate_lock.acquire(timeout=30)  # the worker has finished generate()
    engine._generate_lock.release()
    assert 1 <= lengths[1] < 50


def test_load_failure_surfaces(tmp_path):
    engine = ChatEngine(tmp_path, loader=load_for_chat)
    with pytest.raises(Exception) as info:
        list(engine.stream(str(tmp_path / "missing"), None, PROMPT, GREEDY))
    assert "missing" in str(info.value)


def test_the_base_row_uses_the_base_models_own_template_not_the_tuned_system_line(tiny, tmp_path):
    """Issue 22 item 4: the adapter's tokenizer starts every chat with the bot's system line; the
    base answer beside it is rendered with the base model's own tokenizer, as it would be alone."""
    import shutil

    from jobs.data import encode
    model_dir, adapter_dir, _ = tiny
    tuned_dir = tmp_path / "adapter"
    shutil.copytree(adapter_dir, tuned_dir)
    _, base_tokenizer = load_for_chat(model_dir, None)
    encode.set_default_system(base_tokenizer, "You are Zed, made by Acme.")
    base_tokenizer.save_pretrained(tuned_dir)   # what a job saves beside its adapter
    engine = ChatEngine(tmp_path, loader=load_for_chat)
    tuned = engine.prompt(model_dir, str(tuned_dir), PROMPT, use_adapter=True)
    base = engine.prompt(model_dir, str(tuned_dir), PROMPT, use_adapter=False)
    assert tuned.startswith("<|im_start|>system\nYou are Zed, made by Acme.<|im_end|>")
    assert base == "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"
    frames = list(engine.stream_batch(model_dir, str(tuned_dir), [PROMPT, PROMPT], GREEDY, [True, False]))
    plain = final(engine.stream(model_dir, None, PROMPT, GREEDY))[-1]
    assert frames[-1][1] == plain   # the base row answers exactly as the base model alone
    # issue 42, "served elsewhere": the tuned model through the base's tokenizer and template, as
    # vLLM or a PEFT script load the adapter (no system line of ours)
    assert engine.prompt(model_dir, str(tuned_dir), PROMPT, use_adapter=True, base_template=True) == base
    served = final(engine.stream_batch(model_dir, str(tuned_dir), [PROMPT], GREEDY, [True], base_template=True))
    assert served and isinstance(served[-1][0], str)


def test_release_unloads_the_models_for_a_job_but_not_while_answering(tiny):
    """The runner's way to make room on the GPU (jobs/placement.StudioGpuUse)."""
    model_dir, adapter_dir, root = tiny
    engine = ChatEngine(root, loader=load_for_chat)
    engine.load(model_dir, adapter_dir)
    assert engine.held_gb() == {}  # on the CPU nothing is held on a GPU
    with engine._generate_lock:     # a reply is being generated
        assert not engine.can_release() and not engine.release("job 'x'")
    with engine._cache_lock:        # a model is loading
        assert not engine.can_release() and not engine.release("job 'x'") and engine.held_gb() == {}
    assert engine.is_loaded(model_dir, adapter_dir)
    assert engine.can_release() and engine.release("job 'x'")
    assert not engine.is_loaded(model_dir, adapter_dir) and engine.released_for == "job 'x'"
