"""bench/ for preference tuning (issue 19): the pair generator's lengths, and bench_job.py's DPO
smoke run on CPU through `python -m jobs.train` (both stacks), one JSON line each; KTO's rows (issue
38): the same pairs unpaired, as our job reads them. Measures nothing."""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench.pref_data import pair_rows, write_preference_data
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


def test_kto_rows_are_the_pairs_unpaired_and_our_kto_job_reads_them(tmp_path):
    """Each pair a desirable and an undesirable example (TRL's prompt/completion/label form), pair by
    pair; bench_job's KTO config is a valid JobSpec whose rows jobs/data/pairs.py reads as KTO units,
    and a unit's two sequences (example + KL sequence) hold kto_stats' mean_forward tokens, a pair's."""
    from transformers import AutoTokenizer

    from bench.bench_job import job_config
    from jobs.data.pairs import load_units
    from jobs.spec import JobSpec
    tiny = make_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    stats = write_preference_data(tmp_path, tokenizer, 6)
    pairs = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (tmp_path / "kto.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [True, False] * 6
    assert (rows[2]["prompt"], rows[2]["completion"], rows[3]["completion"]) == (
        pairs[1]["prompt"], pairs[1]["chosen"], pairs[1]["rejected"])
    assert stats["kto"]["examples"] == 12 and abs(stats["kto"]["mean_forward"] - 2 * stats["kto"]["mean"]) <= 0.2
    assert abs(stats["kto"]["mean_forward"] - stats["dpo"]["mean_forward"]) <= 0.2
    args = argparse.Namespace(method="kto", dir=tmp_path, pairs=4, max_len=2560, steps=3, device="cpu",
                              checkpointing="auto", base_precision="bf16", max_gpu_memory_gb=0.0,
                              load_in_4bit=False, micro_batch=2)
    for stack in ("fusetune", "torch"):
        config = job_config(stack, args, tiny, tmp_path / "data.jsonl", tmp_path / f"out-{stack}")
        spec = JobSpec.from_dict(config)
        assert (spec.method, spec.dataset) == ("kto", str(tmp_path / "kto.jsonl"))
    units = load_units(spec, tokenizer, log=lambda *_: None)
    assert [u.label for u in units] == [True, False] * 6
    forward = sum(len(u.first.input_ids) + len(u.second.input_ids) for u in units) / len(units)
    assert abs(forward - stats["kto"]["mean_forward"]) <= 0.2
