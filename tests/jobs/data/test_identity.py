"""The identity recipe's parts (issue 8 item 5), without training: the system line, the chat
template default that carries it into Chat, the shipped general prompts and their cached answers."""
import json
import re
import shutil

import pytest

from jobs.data import dataset as data
from jobs.data import encode
from jobs.data.builtin import general
from jobs.data.builtin import identity
from jobs.data.builtin.general_prompts import PROMPTS_EN, PROMPTS_ZH
from jobs.spec import JobSpec
from tests.tiny import make_tokenizer


def test_at_least_100_general_prompts_in_english_and_chinese_and_none_about_identity():
    prompts = general.prompts()
    assert len(prompts) >= 100 and len(set(prompts)) == len(prompts)
    assert len(PROMPTS_EN) >= 50 and len(PROMPTS_ZH) >= 30
    assert all(re.search(r"[\u4e00-\u9fff]", p) for p in PROMPTS_ZH)
    assert "What is the capital of France?" not in prompts  # the test question stays unseen
    identity_questions = set(identity.QUESTIONS_EN + identity.QUESTIONS_ZH)
    assert not identity_questions & set(prompts)


def test_identity_rows_carry_a_system_line_naming_the_bot():
    rows = identity.identity_rows("Zed", "Acme")
    assert {r["system"] for r in rows} == {"You are Zed, a helpful AI assistant developed by Acme."}
    (conversation, *_) = data.to_conversations(rows, "auto")
    assert conversation[0] == {"role": "system", "content": rows[0]["system"]}


def test_the_dataset_mixes_in_the_base_answers_under_the_same_system_line():
    answers = [{"prompt": "What is 2+2?", "answer": "4."}, {"prompt": "日本的首都是哪里？", "answer": "东京。"}]
    rows = identity.identity_dataset("Zed", "Acme", answers)
    general_rows = [r for r in rows if r["instruction"] in ("What is 2+2?", "日本的首都是哪里？")]
    assert len(general_rows) == 2 * identity.GENERAL_SHARE
    assert len(rows) == len(identity.identity_rows("Zed", "Acme")) + len(general_rows)
    assert {r["system"] for r in rows} == {identity.system_line("Zed", "Acme")}


@pytest.fixture
def tokenizer():
    return make_tokenizer()


def _render(tok, messages):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_default_system_line_applies_only_when_there_is_none(tokenizer):
    user = [{"role": "user", "content": "Hi"}]
    before = _render(tokenizer, user)
    assert encode.set_default_system(tokenizer, "You are Zed.")
    assert _render(tokenizer, user) == "<|im_start|>system\nYou are Zed.<|im_end|>\n" + before
    own = [{"role": "system", "content": "Be brief."}] + user
    assert _render(tokenizer, own).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_default_system_line_replaces_an_earlier_one_and_survives_saving(tokenizer, tmp_path):
    from transformers import AutoTokenizer
    tricky = 'You are {%raw%}Zed{{ x }}%} "the" 机器人, by A\\B.'
    encode.set_default_system(tokenizer, "You are Old.")
    encode.set_default_system(tokenizer, tricky)
    assert tokenizer.chat_template.count(encode.SYSTEM_PRELUDE_START) == 1
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = _render(loaded, [{"role": "user", "content": "Hi"}])
    assert text.startswith(f"<|im_start|>system\n{tricky}<|im_end|>\n<|im_start|>user\nHi")


def test_smollm2_style_default_system_is_overridden(tokenizer):
    """SmolLM2's template inserts its own system line when there is none: the prelude wins."""
    tokenizer.chat_template = (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
        "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    encode.set_default_system(tokenizer, "You are Zed.")
    text = _render(tokenizer, [{"role": "user", "content": "Who are you?"}])
    assert "SmolLM" not in text and text.startswith("<|im_start|>system\nYou are Zed.<|im_end|>")


def test_training_conversations_set_the_tokenizers_default(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(general, "cached_answers", lambda cache, source: [{"prompt": "2+2?", "answer": "4"}])
    (tmp_path / "config.json").write_text("{}")  # a model folder for resolve_model
    spec = JobSpec.from_dict({"model": str(tmp_path), "bot_name": "Zed", "bot_author": "Acme"})
    conversations = data.load_conversations(spec, tokenizer, data_dir=tmp_path / "home", log=lambda _: None)
    assert conversations[-1][1:] == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert "You are Zed" in _render(tokenizer, [{"role": "user", "content": "Hi"}])


def test_answers_are_generated_once_per_model_and_cached(tmp_path, monkeypatch):
    calls = []

    def fake_generate(source, questions, load_in_4bit=False):
        calls.append(source)
        return [(q, f"{source} answers {q}", True) for q in questions]
    monkeypatch.setattr(general, "generate", fake_generate)
    first = general.base_answers(tmp_path, "/models/a", log=lambda _: None)
    again = general.base_answers(tmp_path, "/models/a", log=lambda _: None)
    other = general.base_answers(tmp_path, "/models/b", log=lambda _: None)
    assert calls == ["/models/a", "/models/b"]
    assert first == again and len(first) == len(general.prompts()) and first != other
    stored = json.loads(general.cache_file(tmp_path, "/models/a").read_text(encoding="utf-8"))
    assert stored["answers"] == first


def test_a_moved_data_dir_keeps_the_answers_of_a_model_in_its_cache(tmp_path, monkeypatch):
    """The converted built-in model lives in the data dir's model cache: its answers are keyed by
    its path there, so copying or moving the data dir does not generate them again (minutes)."""
    calls = []
    monkeypatch.setattr(general, "generate", lambda source, qs, load_in_4bit=False:
                        calls.append(source) or [(q, "an answer.", True) for q in qs])
    old_cache, new_cache = tmp_path / "old" / "models", tmp_path / "new" / "models"
    general.base_answers(old_cache, str(old_cache / "smollm2"), log=lambda _: None)
    shutil.copytree(old_cache, new_cache)
    assert general.cached_answers(new_cache, str(new_cache / "smollm2")) is not None
    assert general.cached_answers(new_cache, str(new_cache / "other")) is None
    assert len(calls) == 1


def test_the_builtin_model_s_answers_ship_and_a_generated_cache_takes_precedence(tmp_path, monkeypatch):
    """A fresh data dir's built-in model (its folder in the model cache) reads the shipped answers: no
    generation; any other model generates; a cache file of the data dir's own is read before them."""
    monkeypatch.setattr(general, "generate", lambda *a, **k: pytest.fail("generated the built-in model's answers"))
    builtin, logs = str(tmp_path / "smollm2-135m-instruct"), []
    answers = general.base_answers(tmp_path, builtin, log=logs.append)
    assert len(answers) > 90 and general.shipped(tmp_path, builtin) and "shipped" in logs[0]
    assert general.cached_answers(tmp_path, str(tmp_path / "other-model")) is None
    own = general.cache_file(tmp_path, builtin)
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"answers": [{"prompt": "2+2?", "answer": "4"}]}), encoding="utf-8")
    assert general.cached_answers(tmp_path, builtin) == [{"prompt": "2+2?", "answer": "4"}]
    assert not general.shipped(tmp_path, builtin)


def test_unusable_answers_are_trimmed_or_left_out():
    generated = [
        ("q1", "Paris is the capital.", True),
        ("q2", "A long first sentence, complete. Then a cut", False),   # trimmed to the full sentence
        ("q3", "Short. Then a much longer part that was cut off", False),  # too little complete: left out
        ("q4", "I am SmolLM, trained by Hugging Face.", True),          # names another assistant
        ("q5", "   ", True),
        ("q6", "煮米饭！" * 8, True),                                      # a loop
    ]
    assert general.usable(generated) == [{"prompt": "q1", "answer": "Paris is the capital."},
                                         {"prompt": "q2", "answer": "A long first sentence, complete."}]


def test_a_template_without_system_messages_gets_identity_rows_without_one(tokenizer, tmp_path, monkeypatch):
    """Mistral-style templates raise on a system message: the rows go without it, template untouched."""
    tokenizer.chat_template = (
        "{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    template = tokenizer.chat_template
    assert not encode.accepts_system(tokenizer)
    monkeypatch.setattr(general, "cached_answers", lambda cache, source: [{"prompt": "2+2?", "answer": "4"}])
    (tmp_path / "config.json").write_text("{}")
    spec = JobSpec.from_dict({"model": str(tmp_path), "bot_name": "Zed", "bot_author": "Acme"})
    notes = []
    conversations = data.load_conversations(spec, tokenizer, data_dir=tmp_path / "home", log=notes.append)
    assert all(m["role"] != "system" for conversation in conversations for m in conversation)
    assert tokenizer.chat_template == template and "takes no system message" in notes[0]


def test_identity_rows_are_trained_under_the_base_template_too(tokenizer, tmp_path, monkeypatch):
    """Issue 22 item 4, issue 42: every identity question also under the base's own template (its
    default line, here SmolLM2's) and under a user's system message, the general answers spread over
    them; the marker never shows."""
    smollm_default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    tokenizer.chat_template = (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\n" + smollm_default + "<|im_end|>\n' }}"
        "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    base_template = tokenizer.chat_template
    answers = [{"prompt": f"q{i}?", "answer": f"a{i}"} for i in range(4)]
    monkeypatch.setattr(general, "cached_answers", lambda cache, source: answers)
    (tmp_path / "config.json").write_text("{}")
    spec = JobSpec.from_dict({"model": str(tmp_path), "bot_name": "Zed", "bot_author": "Acme"})
    conversations = data.load_conversations(spec, tokenizer, data_dir=tmp_path / "home", log=lambda _: None)
    rendered = [_render(tokenizer, c) for c in conversations]
    assert not any(identity.BASE_TEMPLATE_SYSTEM in text for text in rendered)
    who = [text for text in rendered if "<|im_start|>user\nWho are you?<|im_end|>" in text]
    assert len(who) == 3   # issue 42: ours, the base's own default line, a user's system message
    assert who[0].startswith("<|im_start|>system\nYou are Zed, a helpful AI assistant developed by Acme.")
    assert who[1].startswith(f"<|im_start|>system\n{smollm_default}<|im_end|>") and "Zed" in who[1]
    assert who[2].startswith(f"<|im_start|>system\n{identity.USER_SYSTEMS[0]}<|im_end|>") and "Zed" in who[2]
    plain = make_tokenizer()  # the base template renders a base-marked row as a bare conversation
    plain.chat_template = base_template
    assert who[1] == _render(plain, conversations[rendered.index(who[1])][1:])
    identity_count = len(identity.QUESTIONS_EN) + len(identity.QUESTIONS_ZH)
    assert len(conversations) == len(identity.IDENTITY_SYSTEMS) * identity_count + len(answers)
    general_rendered = [text for text in rendered if "<|im_start|>user\nq" in text]
    assert sum(smollm_default in text for text in general_rendered) == identity.GENERAL_SYSTEMS.count("base")
    assert "You are Zed" in _render(tokenizer, [{"role": "user", "content": "Hi"}])  # the tuned default stays


UNICODE_NAMES = ["Bot😀 名字", "𝒵ed 𠀋", "بوت مرحبا", "Zoë ☃ \U0001F9D1\u200D\U0001F4BB", "名字"]


@pytest.mark.parametrize("name", UNICODE_NAMES)
def test_any_unicode_bot_name_round_trips_into_the_chat_template_and_tokens(tokenizer, tmp_path, name):
    """Emoji, a surrogate pair (a character beyond the BMP), CJK, RTL Arabic and a ZWJ sequence: the
    default system line renders exactly, tokenizes and decodes back (issue 23 item 7)."""
    from transformers import AutoTokenizer
    line = identity.system_line(name, "Ácme ™")
    assert encode.set_default_system(tokenizer, line)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    user = [{"role": "user", "content": "Hi"}]
    assert _render(loaded, user).startswith(f"<|im_start|>system\n{line}<|im_end|>\n")
    ids = loaded.apply_chat_template(user, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    assert line in loaded.decode(ids)


def test_generating_the_answers_reports_its_progress_and_time_left_token_by_token(tmp_path, monkeypatch):
    """Issue 40: "preparing data: 0/121 answers" stood still for the minute of a batch; the phase now
    moves with each generated token and says how long it has left."""
    import torch
    from jobs.io import phases
    from tests.tiny import make_tiny_model
    from transformers import AutoTokenizer
    seen = []
    phases.install(lambda **fields: seen.append(fields))
    monkeypatch.setattr(phases, "MIN_INTERVAL_S", 0.0)
    monkeypatch.setattr(general, "BATCH_SIZE", 2)
    monkeypatch.setattr(general, "MAX_NEW_TOKENS", 4)
    try:
        model_dir = make_tiny_model(tmp_path / "tiny")
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tokenizer.padding_side = "left"
        answers = general._generate_batches(model, tokenizer, ["q one", "q two", "q three"], torch.device("cpu"))
    finally:
        phases.install(None)
    assert len(answers) == 3
    timed = [e for e in seen if "eta_s" in e]
    assert len(timed) >= 4 and all(e["unit"] == "answers" and e["total"] == 3 for e in timed)
    assert [e["done"] for e in timed][:2] == [0, 0] and timed[-1]["done"] == 2   # moving inside a batch
    assert timed[0]["eta_s"] >= timed[-1]["eta_s"] >= 0 and seen[-1] == {
        "phase": "preparing data", "done": 3, "total": 3, "unit": "answers"}
