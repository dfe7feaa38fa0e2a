"""Preference data (issue 19 item 2): every format detected and read, encoded with labels on the
answer only, previewed for the studio, and the preflight's refusals and notes naming rows."""
import json

import pytest

from jobs.checks.preflight import run_preflight
from jobs.data.conversation import DataError
from jobs.data.encode import IGNORE_INDEX
from jobs.data.pairs import load_units
from jobs.data.preference import encode_answer, preference_format, preview_pairs, read_row
from jobs.models import load as models
from jobs.spec import JobSpec

USER = {"role": "user", "content": "Capital of France?"}
GOOD, BAD = {"role": "assistant", "content": "Paris."}, {"role": "assistant", "content": "Rome, I believe."}
FORMATS = [
    ("explicit", {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": "Rome, I believe."}),
    ("explicit", {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]}),
    ("implicit", {"chosen": [USER, GOOD], "rejected": [USER, BAD]}),
    ("sharegpt_pairs", {"conversations": [{"from": "human", "value": "Capital of France?"}],
                        "chosen": {"from": "gpt", "value": "Paris."}, "rejected": {"from": "gpt", "value": "Rome, I believe."}}),
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return models.load_tokenizer(str(tiny_model))


@pytest.mark.parametrize("fmt, row", FORMATS)
def test_every_pair_format_reads_to_the_same_prompt_and_answers(fmt, row):
    assert preference_format(row) == fmt
    pref = read_row(row)
    assert pref.prompt == [USER] and pref.chosen == [GOOD] and pref.rejected == [BAD]


def test_kto_rows_and_a_system_prompt_and_history():
    pref = read_row({"prompt": "Hi", "completion": "Hello!", "label": False})
    assert preference_format({"prompt": 1, "completion": 2, "label": 3}) == "unpaired"
    assert pref.rejected is None and pref.label is False and pref.chosen[0]["role"] == "assistant"
    system = {"role": "system", "content": "Be brief."}
    history = [system, USER, GOOD, {"role": "user", "content": "And Italy?"}]
    pref = read_row({"chosen": history + [{"role": "assistant", "content": "Rome."}],
                     "rejected": history + [{"role": "assistant", "content": "Paris again."}]})
    assert pref.prompt == history and pref.chosen == [{"role": "assistant", "content": "Rome."}]


@pytest.mark.parametrize("row, field", [
    ({"prompt": "Q", "chosen": 3, "rejected": "b"}, "chosen"),
    ({"chosen": "a", "rejected": "b"}, "chosen"),
    ({"prompt": "Q", "completion": "a", "label": "maybe"}, "label"),
])
def test_a_bad_row_names_its_field(row, field):
    with pytest.raises(DataError, match=field):
        read_row(row)


def test_kto_labels_are_booleans_only_and_a_text_or_number_label_is_named_by_row(tmp_path):
    """Issue 36 item 6: "true" and 1 were taken as labels (a quoted "false", or a 0/1 score column,
    would train a row the wrong way without a word). Only a CSV, which has no booleans, gives words."""
    from jobs.data.dataset import scan_rows
    from jobs.data.pairs import read_preference_rows
    rows = [{"prompt": "Q", "completion": "a", "label": label} for label in (True, "true", 1, 0, False)]
    found, problems = scan_rows(_jsonl(tmp_path / "k.jsonl", rows))
    read = read_preference_rows(found, True, "kto", problems)
    assert [r.label for r in read] == [True, False] and problems.count == 3
    message = str(problems.error(found.name))
    for row, value in ((2, "'true'"), (3, "1"), (4, "0")):
        assert f"row {row} (line {row}) (unpaired): field 'label' must be a boolean" in message and value in message
    csv = tmp_path / "k.csv"
    csv.write_text("prompt,completion,label\nQ,a,true\nQ,b,False\nQ,c,1\n")
    found, problems = scan_rows(str(csv))
    assert [r.label for r in read_preference_rows(found, True, "kto", problems)] == [True, False]
    assert problems.count == 1 and "row 3 (line 4) (unpaired): field 'label'" in str(problems.error(found.name))


def test_labels_cover_the_answer_only_and_preview_marks_it(tokenizer):
    pref = read_row(FORMATS[0][1])
    example = encode_answer(tokenizer, pref.prompt, pref.chosen, 256)
    trained = [t for t, label in zip(example.input_ids, example.labels) if label != IGNORE_INDEX]
    assert tokenizer.decode(trained).startswith("Paris.")
    assert example.labels[0] == IGNORE_INDEX and "France" not in tokenizer.decode(trained)
    shown = preview_pairs([FORMATS[0][1], {"prompt": "Hi", "completion": "Hello", "label": True}], tokenizer, 256, 5)
    assert "Capital of France?" in shown[0]["prompt"] and shown[0]["chosen"].startswith("Paris.")
    assert shown[0]["rejected"].startswith("Rome") and "Paris" not in shown[0]["prompt"]
    assert shown[1]["completion"].startswith("Hello") and shown[1]["label"] is True


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _spec(tiny_model, dataset, method="dpo", **kw):
    return JobSpec.from_dict({"model": str(tiny_model), "dataset": dataset, "method": method, **kw})


def test_units_hold_both_sides_and_kto_pairs_each_prompt_with_another_completion(tmp_path, tiny_model, tokenizer):
    pairs = _jsonl(tmp_path / "p.jsonl", [FORMATS[0][1]] * 3)
    units = load_units(_spec(tiny_model, pairs), tokenizer, log=lambda _l: None)
    assert len(units) == 3 and units[0].first.input_ids != units[0].second.input_ids
    rows = [{"prompt": f"Q{i}", "completion": f"answer {i}", "label": i % 2 == 0} for i in range(4)]
    units = load_units(_spec(tiny_model, _jsonl(tmp_path / "k.jsonl", rows), "kto"), tokenizer, log=lambda _l: None)
    assert [u.label for u in units] == [True, False, True, False]
    for unit in units:   # same prompt, a different row's completion
        assert unit.first.input_ids != unit.second.input_ids


def test_preflight_refuses_a_preference_method_on_sft_rows_naming_rows_and_method(tmp_path, tiny_model):
    sft = [{"instruction": "Add", "input": "2+2", "output": "4"}] * 3
    report = run_preflight(_spec(tiny_model, _jsonl(tmp_path / "sft.jsonl", sft)), log=lambda _l: None)
    assert not report.ok and report.problems[0].key == "dataset"
    assert "row 1" in report.problems[0].message and "method dpo" in report.problems[0].message
    kto = run_preflight(_spec(tiny_model, _jsonl(tmp_path / "pairs.jsonl", [FORMATS[0][1]]), "kto"), log=lambda _l: None)
    assert "method kto needs prompt/completion/label rows" in kto.problems[0].message


def test_preflight_refuses_sft_on_preference_rows(tmp_path, tiny_model):
    path = _jsonl(tmp_path / "pairs.jsonl", [FORMATS[3][1]] * 2)
    report = run_preflight(_spec(tiny_model, path, "sft"), log=lambda _l: None)
    message = report.problems[0].message
    assert "2 preference rows (row 1 (line 1), row 2 (line 2))" in message and "method is sft" in message


def test_preflight_counts_identical_empty_and_over_long_pairs_by_row(tmp_path, tiny_model):
    rows = [FORMATS[0][1], {"prompt": "Q", "chosen": "same", "rejected": "same"},
            {"prompt": "Q " * 40, "chosen": "long " * 30, "rejected": "x"}]
    report = run_preflight(_spec(tiny_model, _jsonl(tmp_path / "p.jsonl", rows), max_seq_length=64), log=lambda _l: None)
    assert report.ok, report.problems
    notes = " ".join(report.notes)
    assert "1 pairs have identical chosen and rejected answers (row 2 (line 2))" in notes
    assert "longer than max_seq_length=64 (row 3 (line 3))" in notes
    assert report.datasets[0].format == "preference (dpo)"
    empty = run_preflight(_spec(tiny_model, _jsonl(tmp_path / "e.jsonl", rows + [{"prompt": "Q", "chosen": " ",
                                                                                   "rejected": "no"}])),
                          log=lambda _l: None)
    assert not empty.ok and "row 4 (line 4): an answer is empty" in empty.problems[0].message


@pytest.mark.parametrize("overrides, key", [
    ({"method": "dpo", "beta": 0}, "beta"),
    ({"method": "orpo", "orpo_lambda": 0}, "orpo_lambda"),
    ({"method": "kto", "kto_desirable_weight": 0, "kto_undesirable_weight": 0}, "kto_desirable_weight"),
    ({"method": "simpo", "precompute_reference": True}, "precompute_reference"),
    ({"method": "ppo"}, "method"),
    ({"method": "dpo", "simpo_gamma": -1}, "simpo_gamma"),
    ({"method": "dpo", "dataset_format": "alpaca"}, "dataset_format"),
])
def test_preference_keys_are_validated_by_name(overrides, key):
    from jobs.spec import SpecError
    with pytest.raises(SpecError) as caught:
        JobSpec.from_dict(overrides)
    assert caught.value.key == key


def test_preference_defaults_are_trls():
    spec = JobSpec.from_dict({"method": "dpo", "dataset": "builtin:concise"})   # identity holds no pairs
    assert (spec.beta, spec.simpo_gamma, spec.orpo_lambda) == (0.1, 0.5, 0.1)
    assert (spec.kto_desirable_weight, spec.kto_undesirable_weight, spec.precompute_reference) == (1.0, 1.0, False)


def test_sft_training_on_preference_rows_says_which_method_to_pick():
    from jobs.data.dataset import detect_format
    for _fmt, row in FORMATS:
        with pytest.raises(DataError, match="set method to dpo"):
            detect_format([row])
