"""`python -m jobs.evaluate` end to end on the tiny trained job (tests/jobs/conftest.py `tiny_job`, shared
with the export and serve tests), in this process: base and tuned answers to the same prompts, their
scores, the table with its interval, the per-row JSONL/CSV and the events, written into the job folder;
preference pairs by log-prob margin, GRPO rewards, the held-out split, and a SIGTERM that keeps what
was done."""
import csv
import json
import os
import shutil
import signal
import threading
import time

import pytest
import yaml

from jobs.evaluate.cli import main
from jobs.evaluate.config import EvalConfig
from jobs.evaluate.data import load_eval_data
from jobs.export.job_config import exported_spec
from jobs.io.events import read_events
from jobs.io.layout import JobLayout
from jobs.train.evaluate import split_holdout


@pytest.fixture
def job(tiny_job, tmp_path):
    """A copy of the trained job (the session's own stays as the other modules expect it)."""
    copy = tmp_path / "llama-job"
    shutil.copytree(tiny_job, copy, ignore=shutil.ignore_patterns("checkpoints", "evaluations"))
    shutil.copy(tiny_job.parent / "chat.jsonl", tmp_path / "chat.jsonl")
    return copy


def _config(tmp_path, **values):
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _only_evaluation(job):
    (folder,) = JobLayout(job).evaluations.iterdir()
    return JobLayout(job).evaluation(folder.name)


def test_cli_writes_the_table_and_the_rows(job, tmp_path, capsys, in_process_cli):
    config = _config(tmp_path, job=str(job), eval_file=str(job.parent / "chat.jsonl"), limit=6,
                     batch_size=4, max_new_tokens=8, name="chat-6")
    assert main([config]) == 0
    out = capsys.readouterr().out
    assert "rouge_l" in out and "95% CI" in out and "results: " in out
    layout = JobLayout(job).evaluation("chat-6")
    rows = [json.loads(line) for line in layout.rows.read_text().splitlines()]
    assert [r["row"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is the capital of France?"}]
    assert rows[0]["reference"] == "The capital of France is Paris."
    assert all(isinstance(r["base"], str) and isinstance(r["tuned"], str) for r in rows)
    assert rows[0]["base"] != rows[0]["tuned"]    # the adapter changes the answer
    assert set(rows[0]["scores"]["tuned"]) == {"exact_match", "rouge_l", "bleu", "chrf"}
    assert rows[0]["change"]["chrf"] == pytest.approx(rows[0]["scores"]["tuned"]["chrf"] - rows[0]["scores"]["base"]["chrf"])
    with open(layout.rows_csv, newline="", encoding="utf-8") as fh:
        table_rows = list(csv.DictReader(fh))
    assert len(table_rows) == 6 and table_rows[0]["tuned_answer"] == rows[0]["tuned"]
    results = json.loads(layout.results.read_text())
    assert results["rows"] == 6 and not results["cancelled"]
    chrf = next(e for e in results["table"] if e["metric"] == "chrf")
    assert chrf["ci_low"] <= chrf["difference"] <= chrf["ci_high"]
    kinds = [(e["type"], e.get("phase")) for e in read_events(layout.root)]
    assert kinds == [("phase", "loading model"), ("start", None), ("phase", "evaluating"),
                     ("phase", "evaluating"), ("done", None)]
    assert os.stat(layout.rows).st_mode & 0o077 == 0   # private, as every job file
    assert "evaluated 6/6 rows" in layout.log.read_text()


def test_pairs_are_scored_by_log_prob_margin(job, tmp_path, in_process_cli):
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "What is the capital of France?", "chosen": "The capital of France is Paris.",
             "rejected": "Blue is a colour."}, {"prompt": "Who are you?", "chosen": "I am Quokka, built by Acme.",
                                                "rejected": "Two plus two is four."}]
    pairs.write_text("\n".join(json.dumps(r) for r in rows))
    assert main([_config(tmp_path, job=str(job), eval_file=str(pairs))]) == 0
    records = [json.loads(line) for line in _only_evaluation(job).rows.read_text().splitlines()]
    for record in records:
        for side in ("base", "tuned"):
            scores = record["scores"][side]
            assert scores["prefers_chosen"] == (100.0 if scores["logprob_margin"] > 0 else 0.0)
    assert records[0]["reference"] == rows[0]["chosen"] and records[0]["rejected"] == rows[0]["rejected"]
    assert records[0]["scores"]["base"]["logprob_margin"] != records[0]["scores"]["tuned"]["logprob_margin"]


def test_prompt_rows_get_the_named_rewards(job, tmp_path, in_process_cli):
    data = tmp_path / "math.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"{a} + {a}?", "answer": str(2 * a)}) for a in (1, 2, 3)))
    assert main([_config(tmp_path, job=str(job), eval_file=str(data), rewards="answer, format",
                         metrics=["exact_match"], max_new_tokens=4)]) == 0
    results = json.loads(_only_evaluation(job).results.read_text())
    assert [e["metric"] for e in results["table"]] == ["exact_match", "reward/answer", "reward/format"]
    assert all(e["rows"] == 3 for e in results["table"])


def test_the_held_out_split_is_the_trainers(job, tmp_path):
    spec = exported_spec(job)
    spec.eval_fraction = 0.25
    data = load_eval_data("", spec, limit=0)
    _, held = split_holdout(list(range(1, 17)), 0.25, spec.seed)
    assert [r.number for r in data.rows] == held and len(held) == 4
    spec.eval_fraction = 0.0
    with pytest.raises(ValueError, match="eval_file: the job holds out no data"):
        load_eval_data("", spec, limit=0)


def _term_once_rows_appear(layout_root, deadline=120):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if list(layout_root.glob("*/rows.jsonl")):
            os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(0.05)


def test_sigterm_stops_and_keeps_the_rows_done(job, tmp_path, in_process_cli):
    config = _config(tmp_path, job=str(job), eval_file=str(job.parent / "chat.jsonl"), limit=16,
                     batch_size=1, max_new_tokens=24)
    previous = signal.getsignal(signal.SIGTERM)
    watcher = threading.Thread(target=_term_once_rows_appear, args=(JobLayout(job).evaluations,))
    try:
        watcher.start()
        assert main([config]) == 130
    finally:
        watcher.join()
        signal.signal(signal.SIGTERM, previous)
    layout = _only_evaluation(job)
    results = json.loads(layout.results.read_text())
    done = len(layout.rows.read_text().splitlines())
    assert results["cancelled"] and 1 <= results["rows"] == done < 16
    assert read_events(layout.root)[-1]["cancelled"] is True
    assert EvalConfig.from_yaml(layout.config, to_run=False).name == layout.root.name
