"""Preflight (issue 8 item 3): what the studio's Start and `jobs.train --dry-run` check before a job
is queued, each refusal naming the field or the rows, on a tiny real model."""
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import time
import types

import pytest

from jobs.checks.access import DataAccess
from jobs.checks.preflight import PreflightError, run_preflight
from jobs.spec import JobSpec
from tests.conftest import ROOT

ROW = {"instruction": "Add", "input": "2+2", "output": "4"}


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def _spec(tiny_model, dataset, **kw):
    return JobSpec.from_dict({"model": str(tiny_model), "dataset": str(dataset), **kw})


def _keys(report):
    return [p.key for p in report.problems]


def test_a_good_job_passes_with_a_summary(tmp_path, tiny_model):
    data = _jsonl(tmp_path / "d.jsonl", [ROW] * 7)
    report = run_preflight(_spec(tiny_model, data, target_modules="q_proj,v_proj"), log=lambda _: None)
    assert report.ok, report.problems
    (train,) = report.datasets
    assert (train.rows, train.format) == (7, "alpaca")
    assert train.tokens["min"] == train.tokens["max"] > 0
    assert 0 < train.trained_tokens < train.tokens_total
    assert report.chat_template == "the model's own" and report.max_positions == 512
    text = report.summary()
    assert "preflight: ok" in text and "d.jsonl: 7 rows (alpaca)" in text and "60 steps x 4 rows" in text
    assert report.raise_if_failed() is report


def test_unknown_target_modules_and_too_long_sequences_name_their_fields(tmp_path, tiny_model):
    data = _jsonl(tmp_path / "d.jsonl", [ROW])
    report = run_preflight(_spec(tiny_model, data, target_modules="q_proj,qkv_proj", max_seq_length=4096),
                           log=lambda _: None)
    assert sorted(_keys(report)) == ["max_seq_length", "target_modules"]
    messages = {p.key: p.message for p in report.problems}
    assert messages["target_modules"].startswith("qkv_proj is not a linear layer of this model")
    assert "q_proj" in messages["target_modules"] and "down_proj" in messages["target_modules"]
    assert "limit of 512 tokens" in messages["max_seq_length"]
    with pytest.raises(PreflightError) as refused:
        report.raise_if_failed()
    assert refused.value.key == report.problems[0].key


@pytest.mark.parametrize("name, content, expected", [
    ("empty.csv", b"", "empty.csv is empty: a CSV needs a header line"),
    ("fake.parquet", b'[{"a": 1}]', "fake.parquet is not a Parquet file"),
    ("latin1.jsonl", '{"text": "café"}'.encode("latin-1"), "row 1 (line 1) is not UTF-8 text (undecodable byte at offset 13"),
    ("broken.json", b'[{"text": "a"},\n {"text" "b"}]', "row 2 (line 2) is not valid JSON"),
    ("fields.jsonl", b'{"instruction": "x", "input": "", "output": ""}', "row 1 (line 1, alpaca): field 'output' is missing"),
])
def test_bad_files_are_refused_naming_the_file_and_row(tmp_path, tiny_model, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content)
    report = run_preflight(_spec(tiny_model, path), log=lambda _: None)
    assert _keys(report) == ["dataset"]
    assert expected in report.problems[0].message


def test_every_bad_row_is_counted_and_the_first_ten_named(tmp_path, tiny_model):
    rows = [ROW if i % 4 else {"instruction": f"q{i}", "output": ""} for i in range(1, 101)]
    report = run_preflight(_spec(tiny_model, _jsonl(tmp_path / "d.jsonl", rows)), log=lambda _: None)
    message = report.problems[0].message
    assert message.startswith("d.jsonl has 25 bad rows (the first 10 shown): row 4 (line 4, alpaca)")
    assert "row 40 (line 40, alpaca)" in message and "row 44" not in message


def test_eval_dataset_is_checked_like_the_dataset(tmp_path, tiny_model):
    good = _jsonl(tmp_path / "train.jsonl", [ROW] * 3)
    bad = tmp_path / "eval.csv"
    bad.write_text("")
    report = run_preflight(_spec(tiny_model, good, eval_dataset=str(bad)), log=lambda _: None)
    assert _keys(report) == ["eval_dataset"] and "eval.csv is empty" in report.problems[0].message
    bad.write_text("instruction,input,output\nAdd,2+2,4\n")
    report = run_preflight(_spec(tiny_model, good, eval_dataset=str(bad)), log=lambda _: None)
    assert report.ok and [d.key for d in report.datasets] == ["dataset", "eval_dataset"]


def test_a_model_without_chat_template_says_which_one_is_used(tmp_path, tiny_model):
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_model, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    report = run_preflight(_spec(folder, _jsonl(tmp_path / "d.jsonl", [ROW])), log=lambda _: None)
    assert report.ok and report.chat_template.startswith("ChatML")


def test_identity_jobs_name_the_default_system_line(tmp_path, tiny_model):
    spec = JobSpec.from_dict({"model": str(tiny_model), "bot_name": "Zed", "bot_author": "Acme"})
    report = run_preflight(spec, data_dir=tmp_path, log=lambda _: None)
    assert report.ok, report.problems
    assert "'You are Zed, a helpful AI assistant developed by Acme.'" in report.chat_template
    assert report.datasets[0].rows >= 80


def test_an_offline_hub_model_is_refused_at_once(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [ROW])
    began = time.time()
    report = run_preflight(JobSpec.from_dict({"model": "someone/some-model", "dataset": data}), log=lambda _: None)
    assert time.time() - began < 15
    assert _keys(report) == ["model"]
    assert "HF_HUB_OFFLINE=1" in report.problems[0].message and "local model folder" in report.problems[0].message


def _dry_run(args, **env):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    for key in [k for k, v in env.items() if v is None]:
        full_env.pop(key)
    return subprocess.run([sys.executable, "-m", "jobs.train", "--dry-run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=full_env)


def test_an_unreachable_hub_is_refused_within_seconds_without_offline_mode(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [ROW])
    began = time.time()
    proc = _dry_run(["--model", "someone/some-model", "--dataset", data], HF_HUB_OFFLINE=None,
                    HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    assert proc.returncode != 0
    assert "model: someone/some-model is not in the local Hugging Face cache and the Hugging Face Hub cannot " \
           "be reached" in proc.stderr
    assert time.time() - began < 120  # process start and imports included; the probe is 3 s at most


def test_a_hub_model_in_the_local_cache_is_accepted_offline(tmp_path, tiny_model):
    cache = tmp_path / "hf" / "hub"
    snapshot = cache / "models--someone--tiny" / "snapshots" / "abc123"
    shutil.copytree(tiny_model, snapshot)
    (cache / "models--someone--tiny" / "refs").mkdir()
    (cache / "models--someone--tiny" / "refs" / "main").write_text("abc123")
    data = _jsonl(tmp_path / "d.jsonl", [ROW] * 2)
    proc = _dry_run(["--model", "someone/tiny", "--dataset", data], HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "someone/tiny -> " in proc.stdout and "abc123" in proc.stdout


def test_dry_run_prints_the_summary_and_trains_nothing(tmp_path, tiny_model):
    out = tmp_path / "job"
    data = _jsonl(tmp_path / "d.jsonl", [ROW] * 5)
    proc = _dry_run(["--model", str(tiny_model), "--dataset", data, "--output_dir", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "preflight: ok" in proc.stdout and "d.jsonl: 5 rows (alpaca)" in proc.stdout
    assert not out.exists()
    bad = _dry_run(["--model", str(tiny_model), "--dataset", data, "--target_modules", "nope_proj"])
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("fusetune: target_modules: nope_proj is not a linear layer")


def test_the_studio_policy_refuses_before_reading(tmp_path, tiny_model):
    outside = _jsonl(tmp_path / "outside.jsonl", [ROW])
    access = DataAccess.for_studio(tmp_path / "data", [])
    report = run_preflight(_spec(tiny_model, outside), access=access, log=lambda _: None)
    assert _keys(report) == ["dataset"] and "not available to the studio" in report.problems[0].message
    assert report.datasets == [] and report.model_source is None


def test_the_gpu_memory_estimate_comes_from_jobs_fit_when_present(tmp_path, tiny_model, monkeypatch):
    fake = types.ModuleType("jobs.models.fit")
    fake.__spec__ = importlib.machinery.ModuleSpec("jobs.models.fit", None)
    seen = []

    def estimate_peak(spec, config):
        seen.append((spec.batch_size, config.num_hidden_layers))
        return types.SimpleNamespace(summary=lambda: "1.23 GiB peak", notes=[], total_gb=1.23)
    fake.estimate_peak = estimate_peak
    fake.budget_refusal = lambda spec, config, world=1: None
    fake._cuda_memory = lambda: (None, None)   # no GPU: the sharded plan (jobs/models/fit_shard.py) is the estimate
    monkeypatch.setitem(sys.modules, "jobs.models.fit", fake)
    import jobs.models
    monkeypatch.setattr(jobs.models, "fit", fake, raising=False)
    report = run_preflight(_spec(tiny_model, _jsonl(tmp_path / "d.jsonl", [ROW])), log=lambda _: None)
    assert report.predicted_memory == "1.23 GiB peak" and seen == [(4, 2)]
    from jobs.checks import summary
    monkeypatch.setattr(summary, "read_gpus", lambda: ["a GPU"])
    assert "GPU memory     1.23 GiB peak" in report.summary()
    monkeypatch.setattr(summary, "read_gpus", lambda: [])   # a CPU-only machine says so first
    assert "GPU memory     none on this machine: the job runs on the CPU (on a GPU: 1.23 GiB peak)" in report.summary()


def test_dry_run_refuses_deep_nesting_by_row_without_a_traceback(tmp_path, tiny_model):
    data = tmp_path / "deep.json"
    data.write_bytes(b'[{"instruction": "q", "output": "a"},\n' + b"{\"a\":" * 50_000 + b"1" + b"}" * 50_000 + b"]")
    proc = _dry_run(["--model", str(tiny_model), "--dataset", str(data)])
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    assert "row 2 (line 2) nests brackets" in proc.stderr and "nesting limit of 100" in proc.stderr


def test_rows_whose_messages_are_all_empty_are_counted_and_named(tmp_path, tiny_model):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    blank = {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "  "}]}
    no_answer = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]}
    rows = [good, blank, good, blank]
    report = run_preflight(_spec(tiny_model, _jsonl(tmp_path / "d.jsonl", rows)), log=lambda _: None)
    assert _keys(report) == ["dataset"]
    message = report.problems[0].message
    assert message.startswith("d.jsonl has 2 bad rows: row 2 (line 2, messages): has only "
                              "empty messages (every user and assistant text is blank)")
    assert "row 4 (line 4, messages): has only empty messages" in message
    sharegpt = [{"conversations": good_turns} for good_turns in [[{"from": "human", "value": "q"},
                                                                   {"from": "gpt", "value": "a"}]]] + [no_answer]
    report = run_preflight(_spec(tiny_model, _jsonl(tmp_path / "s.jsonl", sharegpt)), log=lambda _: None)
    assert "s.jsonl has 1 bad row" in report.problems[0].message
    assert "row 2 (line 2, sharegpt): has only empty assistant turns" in report.problems[0].message
