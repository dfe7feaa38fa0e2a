"""Prompt masking, on a hand-built word-level tokenizer whose token ids are known by construction."""
import pytest
import torch

from jobs.data import encode
from jobs.data.dataset import DataError

VOCAB = ["<pad>", "<|im_start|>", "<|im_end|>", "\n", " ", "user", "assistant", "system",
         "Who", "are", "you?", "I", "am", "Zed.", "Be", "brief.", "And", "Ok."]
IDS = {w: i for i, w in enumerate(VOCAB)}


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel(vocab=IDS, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n| "), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = encode.DEFAULT_CHAT_TEMPLATE
    return fast


def ids(*words):
    return [IDS[w] for w in words]


def test_only_the_answer_and_its_end_token_are_trained(tokenizer):
    conv = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Zed."}]
    example = encode.encode(tokenizer, conv, max_length=64)
    prompt = ids("<|im_start|>", "user", "\n", "Who", " ", "are", " ", "you?", "<|im_end|>", "\n",
                 "<|im_start|>", "assistant", "\n")
    answer = ids("I", " ", "am", " ", "Zed.", "<|im_end|>", "\n")
    assert example.input_ids == prompt + answer
    assert example.labels == [-100] * len(prompt) + answer
    assert example.input_ids == [1, 5, 3, 8, 4, 9, 4, 10, 2, 3, 1, 6, 3, 11, 4, 12, 4, 13, 2, 3]


def test_every_assistant_turn_is_trained_and_system_and_users_are_not(tokenizer):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who are you?"},
            {"role": "assistant", "content": "I am Zed."}, {"role": "user", "content": "And you?"},
            {"role": "assistant", "content": "Ok."}]
    example = encode.encode(tokenizer, conv, max_length=128)
    trained = [t for t, label in zip(example.input_ids, example.labels) if label != -100]
    assert trained == ids("I", " ", "am", " ", "Zed.", "<|im_end|>", "\n", "Ok.", "<|im_end|>", "\n")


def test_truncation_and_rows_without_answer_tokens(tokenizer):
    conv = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Zed."}]
    assert len(encode.encode(tokenizer, conv, max_length=15).input_ids) == 15
    logs = []
    kept = encode.encode_all(tokenizer, [conv, conv], max_length=15, log=logs.append)
    assert len(kept) == 2
    with pytest.raises(DataError, match="max_seq_length=8"):
        encode.encode_all(tokenizer, [conv], max_length=8, log=logs.append)


def test_collate_pads_and_masks(tokenizer):
    a = encode.Example([5, 6, 7], [-100, 6, 7])
    b = encode.Example([5], [5])
    batch = encode.collate([a, b], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [5, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert encode.label_count(batch) == 2  # after the shift: 6, 7 in row one, nothing in row two


def test_preview_marks_trained_segments(tokenizer):
    conv = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Zed."}]
    (row,) = encode.preview(tokenizer, [conv], max_length=64)
    assert row["segments"] == [("<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n", False),
                               ("I am Zed.<|im_end|>\n", True)]
    assert row["trained_tokens"] == 7


def test_preview_is_cut_where_training_cuts(tokenizer):
    """A huge answer previews as the max_length tokens the model will see, not the whole row."""
    conv = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": " ".join(["Zed."] * 5000)}]
    (row,) = encode.preview(tokenizer, [conv], max_length=16)  # the prompt is 13 tokens
    assert row["truncated"] and row["tokens"] == 16
    (prompt, prompt_trained), (answer, answer_trained) = row["segments"]
    assert (prompt_trained, answer_trained) == (False, True)
    assert prompt == "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"
    assert answer.split() == ["Zed.", "Zed."]  # 3 tokens: Zed., a space, Zed.


def test_cosine_schedule_warms_up_then_decays():
    from jobs.train.loop import cosine_with_warmup
    f = cosine_with_warmup(warmup=4, total=20)
    values = [f(s) for s in range(20)]
    assert values[0] < values[3] < values[4] == 1.0
    assert all(a >= b for a, b in zip(values[4:], values[5:])) and values[-1] < 0.02
    assert torch.tensor(values).min() >= 0


def test_encode_and_data_do_not_import_each_other():
    """Issue 8 item 10: no import circle. Each imports only the shared jobs.data.conversation."""
    import subprocess
    import sys
    from tests.conftest import ROOT
    for first, other in (("jobs.data.encode", "jobs.data.dataset"), ("jobs.data.dataset", "jobs.data.encode")):
        code = f"import sys, {first}; print({other!r} in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "False", f"importing {first} imported {other}"
