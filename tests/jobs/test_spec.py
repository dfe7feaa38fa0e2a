import pytest

from jobs.spec import BUILTIN_DATASET, BUILTIN_MODEL, JobSpec, SpecError


def test_defaults_are_the_builtin_quick_start():
    spec = JobSpec.from_dict({})
    assert spec.model == BUILTIN_MODEL and spec.dataset == BUILTIN_DATASET
    assert spec.lora_r == 16 and spec.max_seq_length <= 256 and spec.target_modules == "all-linear"


@pytest.mark.parametrize("data,key", [
    ({"lora_r": 0}, "lora_r"),
    ({"lora_r": "sixteen"}, "lora_r"),
    ({"lora_r": 3.5}, "lora_r"),
    ({"learning_rate": -1}, "learning_rate"),
    ({"learning_rate": float("nan")}, "learning_rate"),
    ({"dataset_format": "xml"}, "dataset_format"),
    ({"load_in_4bit": "maybe"}, "load_in_4bit"),
    ({"dataset": "data.txt"}, "dataset"),
    ({"model": "/no/such/folder"}, "model"),
    ({"model": "missing.gguf"}, "model"),
    ({"target_modules": "q_proj; drop table"}, "target_modules"),
    ({"target_modules": []}, "target_modules"),
    ({"max_steps": 0, "num_epochs": 0}, "num_epochs"),
    ({"bot_name": "  "}, "bot_name"),
    ({"lora_rank": 8}, "lora_rank"),
    ({"gradient_checkpointing": "sometimes"}, "gradient_checkpointing"),
    ({"packing": "maybe"}, "packing"),
    ({"base_precision": "fp4"}, "base_precision"),
    ({"eval_fraction": 0.9}, "eval_fraction"),
    ({"eval_dataset": "builtin:identity"}, "eval_dataset"),
    ({"keep_best": True}, "keep_best"),
    ({"gpus": "first"}, "gpus"),
    ({"gpus": "0,0"}, "gpus"),
    ({"gpus": "0,1", "processes": 3}, "processes"),
    ({"processes": -1}, "processes"),
    ({"method": "grpo", "dataset": "builtin:arithmetic", "reward_file": "rewards.txt"}, "reward_file"),
])
@pytest.mark.parametrize("to_run", [True, False])
def test_bad_values_are_refused_naming_the_key(data, key, to_run):
    """Whether the job is to start or has run (its export reads the config back): the same refusals."""
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(data, to_run=to_run)
    assert info.value.key == key
    assert str(info.value).startswith(key)


@pytest.mark.parametrize("data, key", [
    ({"dataset": "{tmp}/moved.jsonl"}, "dataset"),
    ({"eval_dataset": "{tmp}/moved-eval.jsonl"}, "eval_dataset"),
    ({"method": "grpo", "dataset": "builtin:arithmetic", "reward_file": "{tmp}/moved.py"}, "reward_file"),
    ({"resume_from": "{tmp}/checkpoints/step-20"}, "resume_from"),
])
def test_files_only_a_start_reads_are_looked_for_only_to_run(tmp_path, data, key):
    """A job's data, reward file and resume checkpoint may be moved away once it has run; its export
    reads the config with to_run=False and gets the values as written."""
    data = {name: value.format(tmp=tmp_path) for name, value in data.items()}
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(data)
    assert info.value.key == key and str(tmp_path) in str(info.value)
    assert getattr(JobSpec.from_dict(data, to_run=False), key) == data[key]


def test_unknown_key_lists_the_known_ones():
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"epochs": 3})
    assert "num_epochs" in str(info.value)


def test_names_are_bounded_and_hold_no_control_or_bidi_override_character():
    """Issue 36 item 6: a 50 MB name was accepted (refused now by its length alone, at once), and a
    right-to-left override (U+202E) flipped the job dropdown's labels."""
    import time
    began = time.perf_counter()
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"name": "x" * (50 << 20)})
    assert time.perf_counter() - began < 1
    assert str(info.value) == "name: is 52,428,800 characters long, over the limit of 200: shorten it"
    for key, text, char, index in (("name", "run\u202egpj.exe", "U+202E", 4), ("name", "a\nb", "U+000A", 2),
                                   ("bot_name", "Bot\u2066", "U+2066", 4), ("bot_author", "\x1b[31mMe", "U+001B", 1)):
        with pytest.raises(SpecError) as info:
            JobSpec.from_dict({key: text})
        assert info.value.key == key and f"control character {char} at character {index}" in str(info.value)
    spec = JobSpec.from_dict({"name": "שלום \u200f run 1 ✨", "bot_name": "Line one\nline two"})
    assert spec.name.startswith("שלום") and spec.bot_name == "Line one\nline two"   # marks, emoji, a bot's newline


def test_values_from_forms_and_cli_are_coerced():
    spec = JobSpec.from_dict({"lora_r": "8", "load_in_4bit": "false", "learning_rate": "1e-3",
                              "target_modules": "[q_proj, 'v_proj']", "max_steps": 10.0})
    assert spec.lora_r == 8 and spec.load_in_4bit is False and spec.learning_rate == 1e-3
    assert spec.target_modules == ["q_proj", "v_proj"] and spec.max_steps == 10


def test_yaml_round_trip(tmp_path):
    data_file = tmp_path / "d.jsonl"
    data_file.write_text('{"text": "hello"}\n')
    spec = JobSpec.from_dict({"dataset": str(data_file), "lora_r": 4, "target_modules": ["q_proj"]})
    path = spec.write_yaml(tmp_path / "c.yaml")
    assert JobSpec.from_yaml(path) == spec


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="flat mapping"):
        JobSpec.from_yaml(path)


def test_gpus_are_normalised_from_text_and_yaml_lists():
    assert JobSpec.from_dict({"gpus": " 0, 1 "}).gpus == "0,1"
    assert JobSpec.from_dict({"gpus": [2, 3]}).gpu_indices() == [2, 3]
    assert JobSpec.from_dict({"gpus": "ALL"}).gpu_indices() is None
    assert JobSpec.from_dict({}).gpus == "auto"


def test_eval_file_and_fraction_are_exclusive(tmp_path):
    data_file = tmp_path / "eval.jsonl"
    data_file.write_text('{"text": "hello"}\n')
    spec = JobSpec.from_dict({"eval_dataset": str(data_file), "keep_best": True})
    assert spec.keep_best and spec.eval_dataset == str(data_file)
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"eval_dataset": str(data_file), "eval_fraction": 0.1})
    assert info.value.key == "eval_fraction"


def test_grpo_beta_defaults_to_zero_unless_given_and_the_spec_keeps_it():
    grpo = JobSpec.from_dict({"method": "grpo", "dataset": "builtin:arithmetic"})
    assert grpo.beta == 0.0                                   # TRL's GRPOConfig default: no reference pass
    assert JobSpec.from_dict({"method": "grpo", "dataset": "builtin:arithmetic", "beta": 0.05}).beta == 0.05
    assert JobSpec.from_dict({"method": "dpo", "dataset": "builtin:concise"}).beta == 0.1
    assert JobSpec.from_dict(grpo.to_dict()).beta == 0.0      # written to the job's YAML, read back the same


def test_the_identity_dataset_has_its_own_learning_rate_unless_one_is_given():
    """Issue 42: builtin:identity trains at 4e-4 (JobSpec DATASET_DEFAULTS); other data at the field's default."""
    from jobs.spec import DATASET_DEFAULTS
    assert JobSpec.from_dict({}).learning_rate == DATASET_DEFAULTS[BUILTIN_DATASET]["learning_rate"] == 4e-4
    assert JobSpec.from_dict({"learning_rate": 1e-4}).learning_rate == 1e-4
    assert JobSpec.from_dict({"method": "grpo", "dataset": "builtin:arithmetic"}).learning_rate == 2e-4
