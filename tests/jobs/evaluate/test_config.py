"""A bad evaluation config is refused before any model loads, with one line that names the field and
the fix (the CLI's exit 2), as JobSpec refuses a bad training config."""
import pytest
import yaml

from jobs.evaluate.cli import main
from jobs.evaluate.config import EvalConfig
from jobs.spec import SpecError


@pytest.fixture
def job(tmp_path):
    """A folder shaped like a finished job (config + adapter files): enough for the config checks."""
    folder = tmp_path / "job"
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text("model: x\n")
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (folder / "adapter" / name).write_text("{}")
    return folder


@pytest.mark.parametrize("data, field, words", [
    ({"colour": 1}, "colour", "unknown key"),
    ({"max_new_tokens": "many"}, "max_new_tokens", "not a valid int"),
    ({"max_new_tokens": 0}, "max_new_tokens", "below the minimum"),
    ({"metrics": ["bleu", "meteor"]}, "metrics", "'meteor' is not one of exact_match, rouge_l, bleu, chrf"),
    ({"metrics": {"bleu": 1}}, "metrics", "not a valid list of names"),
    ({"eval_file": "nowhere.jsonl"}, "eval_file", "does not exist"),
    ({"eval_file": "builtin:identity"}, "eval_file", "must be a data file"),
    ({"eval_file": "rows.txt"}, "eval_file", "unsupported type"),
    ({"name": "../up"}, "name", "may hold only letters"),
    ({"gpus": "0,1"}, "gpus", "an evaluation runs on one GPU"),
    ({"gpus": "first"}, "gpus", "is not auto, all or a list of GPU numbers"),
])
def test_bad_values_name_the_field(job, data, field, words):
    with pytest.raises(SpecError) as caught:
        EvalConfig.from_dict({"job": str(job), **data})
    assert caught.value.key == field and words in str(caught.value)


def test_a_job_must_be_a_finished_job(job, tmp_path):
    with pytest.raises(SpecError, match="job: .* is not a job folder"):
        EvalConfig.from_dict({"job": str(tmp_path / "none")})
    (job / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(SpecError, match="has no trained adapter yet"):
        EvalConfig.from_dict({"job": str(job)})


def test_a_name_in_use_is_refused(job):
    (job / "evaluations" / "first").mkdir(parents=True)
    with pytest.raises(SpecError, match="name: an evaluation named 'first' already exists"):
        EvalConfig.from_dict({"job": str(job), "name": "first"})


def test_lists_and_strings_both_work(job):
    config = EvalConfig.from_dict({"job": str(job), "metrics": "bleu, chrf", "rewards": ["answer", "format:0.5"]})
    assert config.metrics == ["bleu", "chrf"] and config.rewards == "answer:1, format:0.5"


def test_cli_refuses_in_one_line_with_exit_2(job, tmp_path, capsys, in_process_cli):
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({"job": str(job), "limit": -1}))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: limit: -1 is below the minimum 0"
    path.write_text("job: [unclosed\n")
    assert main([str(path)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
    assert not (job / "evaluations").exists()


def test_a_queued_evaluation_says_in_its_folder_why_it_was_refused(job, in_process_cli):
    """The queue makes the folder and runs the CLI with --in-folder (jobs/queue/evaluations.py): a
    refusal is then an error event there, which the queue shows as the reason."""
    from jobs.io.events import read_events
    from jobs.io.layout import new_eval_folder
    layout = new_eval_folder(job, "queued")
    layout.config.write_text(yaml.safe_dump({"job": str(job), "name": "queued", "gpus": 0, "limit": -1}))
    assert main([str(layout.config), "--in-folder"]) == 2
    assert [(e["type"], e["message"]) for e in read_events(layout.root)] == [
        ("error", "limit: -1 is below the minimum 0")]
    assert EvalConfig.from_dict({"job": str(job), "name": "queued", "gpus": 0}, to_run=False).gpus == "0"
