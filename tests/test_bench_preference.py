"""bench/ for preference tuning (issue 19): the pair generator's lengths, and bench_job.py's DPO
smoke run on CPU through `python -m jobs.train` (both stacks), one JSON line each. Measures nothing."""
import json
import os
import statistics
import subprocess
import sys

from bench.pref_data import pair_rows
from tests.conftest import ROOT
from tests.tiny import make_tiny_model


def _letters(messages):
    return len(messages[0]["content"].split())


def test_pairs_have_the_stated_medians_and_a_long_tail():
    rows = pair_rows(2000, seed=0)
    prompts = [_letters(r["prompt"]) for r in rows]
    answers = [_letters(r[side]) for r in rows for side in ("chosen", "rejected")]
    assert 70 <= statistics.median(prompts) <= 90
    assert 160 <= statistics.median(answers) <= 200
    assert 1200 <= max(answers) <= 2000 and sum(a > 1000 for a in answers) >= 40
    assert all(len(word) == 1 for r in rows[:50] for word in r["chosen"][0]["content"].split())   # one-letter tokens


def test_dpo_smoke_runs_both_stacks_on_cpu(tmp_path):
    tiny = make_tiny_model(tmp_path / "tiny")   # its tokenizer stands in for SmolLM2's here
    out = tmp_path / "job.jsonl"
    env = {**os.environ, "TRITON_INTERPRET": "0"}   # torch paths: the point is the plumbing, fast
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_job.py"), "smoke", "--method", "dpo",
                           "--dir", str(tmp_path / "bj"), "--tokenizer", str(tiny), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["stack"] for r in rows] == ["fusetune (a)", "pytorch (b)"]
    for row in rows:
        assert row["returncode"] == 0 and row["method"] == "dpo", row.get("error")
        assert row["pair_tokens_per_s"] > 0 and row["config"]["method"] == "dpo"
        assert abs(row["first_loss"] - 0.6931) < 1e-3 and "reward_margin" in row["rewards"]
        assert row["pair_dataset"]["pairs"] == 16 and "torch" in row and "transformers" in row
