"""The Train tab's pair preview for preference methods: the prompt, then chosen and rejected side by
side as the model sees them (chat template applied, answers marked as trained), a KTO completion
with its label, a row that is not a pair named; and the method picks the keys shown."""
import json


from jobs.spec import BUILTIN_CONCISE, BUILTIN_DATASET, JobSpec
from studio import form
from studio.pair_render import pairs_html
from studio.method_fields import dataset_default_update, method_updates
from studio.data_preview import preview_data

PAIR = {"prompt": "What is 2+2?", "chosen": "4.", "rejected": "It is <b>five</b>, I think, or maybe 4."}


def preview(data_dir, rows, **changes):
    path = data_dir / "datasets" / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    names = form.form_names()
    values = form.spec_to_values(JobSpec(), names)
    changes = {"model": str(data_dir / "models" / "tiny"), "dataset": str(path), "method": "dpo", **changes}
    for key, value in changes.items():
        values[names.index(key)] = value
    return preview_data(data_dir, names, values)


def test_a_pair_shows_the_templated_prompt_then_both_answers_side_by_side(data_dir):
    out = preview(data_dir, [PAIR, {"prompt": "Hi", "chosen": "Hello!", "rejected": "Go away."}])
    assert out.count('class="ft-pair"') == 2
    assert "ft-pair-prompt" in out and "What is 2+2?" in out and "&lt;|im_start|&gt;assistant" in out
    chosen, rejected = out.split('class="ft-chosen"')[1], out.split('class="ft-rejected"')[1]
    assert chosen.index("4.") < chosen.index("</div>")
    assert "&lt;b&gt;five&lt;/b&gt;" in rejected and "<b>five" not in out  # dataset text is escaped
    assert 'class="ft-answer"' in chosen.split("</div>")[0]  # the answer is marked as trained


def test_a_kto_row_shows_its_completion_and_label(data_dir):
    out = preview(data_dir, [{"prompt": "Hi", "completion": "Hello!", "label": False}], method="kto")
    assert "ft-undesirable" in out and "undesirable (label false)" in out and "Hello!" in out
    assert "Example 1" in out and "Pair 1" not in out


def test_an_sft_row_under_a_preference_method_is_named(data_dir):
    out = preview(data_dir, [{"instruction": "Add", "input": "2+2", "output": "4"}])
    assert "ft-notice" in out and "not a preference row" in out


def test_the_method_shows_its_keys_and_swaps_the_builtin_set():
    keys = [w.name for w in dict(form.grouped_widgets())["preference"]]
    group, *fields, dataset = method_updates("simpo", BUILTIN_DATASET, keys)
    shown = {key for key, update in zip(keys, fields) if update["visible"]}
    assert group["visible"] is True and shown == {"beta", "simpo_gamma"}
    assert dataset["value"] == BUILTIN_CONCISE
    group, *fields, dataset = method_updates("sft", BUILTIN_CONCISE, keys)
    assert group["visible"] is False and dataset["value"] == BUILTIN_DATASET
    *_, kept = method_updates("dpo", "/data/pairs.jsonl", keys)
    assert kept == {"__type__": "update"}  # an uploaded file is the user's pick: kept
    *_, dataset = method_updates("grpo", BUILTIN_DATASET, keys)
    assert dataset["value"] == "builtin:arithmetic"   # Start on built-ins alone works for every method
    *_, dataset = method_updates("dpo", "builtin:arithmetic", keys)
    assert dataset["value"] == BUILTIN_CONCISE
    *_, dataset = method_updates("sft", "builtin:arithmetic", keys)
    assert dataset["value"] == BUILTIN_DATASET
    *_, kept = method_updates("sft", "builtin:shapes", keys)
    assert kept == {"__type__": "update"}  # image-text SFT's built-in set stays with sft
    *_, dataset = method_updates("grpo", "builtin:shapes", keys)
    assert dataset["value"] == "builtin:arithmetic"


def test_grpo_shows_beta_alone_at_its_own_default_and_keeps_a_typed_one():
    keys = [w.name for w in dict(form.grouped_widgets())["preference"]]
    group, *fields, _ = method_updates("grpo", BUILTIN_DATASET, keys, "0.1")
    updates = dict(zip(keys, fields))
    assert group["visible"] is True and {k for k, u in updates.items() if u["visible"]} == {"beta"}
    assert updates["beta"]["value"] == "0.0"                     # grpo's default (JobSpec METHOD_DEFAULTS)
    _, *fields, _ = method_updates("dpo", BUILTIN_DATASET, keys, "0.0")
    assert dict(zip(keys, fields))["beta"]["value"] == "0.1"     # back to the preference default
    _, *fields, _ = method_updates("grpo", BUILTIN_DATASET, keys, "0.3")
    assert "value" not in dict(zip(keys, fields))["beta"]        # a beta the user typed is theirs


def test_an_empty_preview_says_so():
    assert "no rows" in pairs_html([])


def test_the_learning_rate_follows_the_dataset_until_the_user_types_one():
    """Issue 42: builtin:identity's own 4e-4 (JobSpec DATASET_DEFAULTS) on the form, 2e-4 for other data."""
    assert dataset_default_update("learning_rate", BUILTIN_CONCISE, "0.0004")["value"] == "0.0002"
    assert dataset_default_update("learning_rate", BUILTIN_DATASET, "0.0002")["value"] == "0.0004"
    assert "value" not in dataset_default_update("learning_rate", BUILTIN_CONCISE, "0.0003")   # typed: kept
    assert "value" not in dataset_default_update("learning_rate", BUILTIN_DATASET, "0.0004")
