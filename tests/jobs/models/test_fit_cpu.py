"""The CPU RAM estimate (issue 40 item 4): each built-in demo's prediction lies within 20 % of the
peak RSS bench/cpu_memory.py measured on this project's 2-core machine (bench/results/cpu_memory.jsonl),
from the config alone: the built-in model's shape, the job's spec and its data's longest row."""
import json

import pytest
from transformers import LlamaConfig

from jobs.models.fit_cpu import RUNTIME_PART, as_cpu_runs, estimate_ram
from jobs.spec import JobSpec
from tests.conftest import ROOT

# SmolLM2-135M-Instruct, the built-in model (its config.json)
BUILTIN_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)
RECORDED = [json.loads(line) for line in (ROOT / "bench/results/cpu_memory.jsonl").read_text().splitlines() if line]


@pytest.mark.parametrize("row", RECORDED, ids=[row["job"] for row in RECORDED])
def test_each_demo_is_predicted_within_20_percent_of_its_measured_peak(row):
    spec = JobSpec.from_dict({"method": row["method"], "dataset": row["dataset"], "max_steps": row["max_steps"]},
                             to_run=False)
    estimate = estimate_ram(spec, LlamaConfig(**BUILTIN_SHAPE), row["row_tokens"])
    assert 0.8 <= estimate.allocated_gb / row["peak_rss_gib"] <= 1.2, (estimate.breakdown(), row["peak_rss_gib"])
    assert estimate.breakdown()[RUNTIME_PART] == 0.55


def test_the_cpu_job_is_sized_as_the_cpu_trainer_runs_it():
    """auto checkpointing is off on a CPU (every layer keeps its activations); rows as long as measured;
    without a measurement, max_seq_length (an upper bound)."""
    spec = JobSpec(max_seq_length=256)
    assert as_cpu_runs(spec, 121).gradient_checkpointing == "off" and as_cpu_runs(spec, 121).max_seq_length == 121
    assert as_cpu_runs(spec, 900).max_seq_length == 256 and as_cpu_runs(spec).max_seq_length == 256
    assert as_cpu_runs(JobSpec(gradient_checkpointing="on")).gradient_checkpointing == "on"
    measured = estimate_ram(spec, LlamaConfig(**BUILTIN_SHAPE), 121).allocated_gb
    assert estimate_ram(spec, LlamaConfig(**BUILTIN_SHAPE)).allocated_gb > measured


def test_the_preflight_measures_grpo_prompts_for_the_estimate(tmp_path):
    """A GRPO job's rollouts are as wide as its prompts: the preflight's prompt statistics say how wide."""
    from jobs.checks.grpo import check_grpo
    from jobs.checks.preflight import DatasetSummary, PreflightReport
    from tests.tiny import make_tokenizer
    spec = JobSpec(method="grpo", dataset="builtin:arithmetic", max_seq_length=64)
    report = PreflightReport(spec=spec)
    check_grpo(spec, tmp_path, report, DatasetSummary, make_tokenizer())
    tokens = report.datasets[0].tokens
    assert 0 < tokens["min"] <= tokens["mean"] <= tokens["max"] <= 64, tokens


def test_the_dry_run_on_a_cpu_says_the_ram_the_job_takes(tmp_path, tiny_model):
    from jobs.checks.preflight import run_preflight
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"instruction": "Add", "input": "2+2", "output": "4"}) + "\n")
    report = run_preflight(JobSpec.from_dict({"model": str(tiny_model), "dataset": str(data)}), log=lambda _: None)
    assert any(note.startswith("on this CPU: about ") and "GiB of RAM" in note for note in report.notes), report.notes
