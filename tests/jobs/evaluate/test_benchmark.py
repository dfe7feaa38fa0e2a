"""The bundled lm-eval task (jobs/evaluate/tasks/fusetune_tiny_qa) on the built-in model, offline:
lm-evaluation-harness itself scores the base and the base + a LoRA adapter (HFLM's `peft=`), through
`python -m jobs.evaluate` with no eval rows (a benchmark-only evaluation). The adapter is made here,
with random B weights, so no training is needed: tens of seconds."""
import json

import pytest
import yaml

from jobs.evaluate.cli import main
from jobs.evaluate.config import EvalConfig
from jobs.io.events import read_events
from jobs.io.layout import JobLayout
from jobs.spec import SpecError


def _job_on(base, folder):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": str(base), "dataset": "builtin:identity"}))
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.05)
    model.save_pretrained(folder / "adapter")
    return folder


@pytest.mark.slow
def test_bundled_task_runs_on_base_and_tuned_offline(builtin_seed, tmp_path, capsys, in_process_cli):
    job = _job_on(builtin_seed.model_folder(), tmp_path / "builtin-job")
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"job": str(job), "tasks": ["fusetune_tiny_qa"], "task_limit": 4,
                                      "name": "bench"}))
    assert main([str(config), "--data-dir", str(tmp_path / "data")]) == 0
    layout = JobLayout(job).evaluation("bench")
    accuracy = json.loads(layout.benchmarks.read_text())["fusetune_tiny_qa"]["acc"]
    assert 0 <= accuracy["base"] <= 1 and 0 <= accuracy["tuned"] <= 1
    assert accuracy["difference"] == pytest.approx(accuracy["tuned"] - accuracy["base"])
    results = json.loads(layout.results.read_text())
    assert results["benchmarks"]["fusetune_tiny_qa"]["acc"] == accuracy and results["table"] == []
    phases = [e.get("phase") for e in read_events(layout.root) if e["type"] == "phase"]
    assert phases == ["benchmark base", "benchmark tuned"]


def test_an_unknown_task_is_refused_by_name(monkeypatch):
    from jobs.evaluate import harness

    class Registry:   # lm-eval's TaskManager indexes thousands of task files: its list is stood in for
        all_tasks = ["arc_easy"]

    monkeypatch.setattr(harness, "_task_manager", lambda names: Registry())
    with pytest.raises(SpecError, match="tasks: unknown lm-eval task 'no_such_task_x'.*fusetune_tiny_qa"):
        harness.check_tasks(["no_such_task_x", "arc_easy"])
    harness.check_tasks(["fusetune_tiny_qa", "arc_easy"])
    assert EvalConfig.__dataclass_fields__["tasks"].metadata["help"]


def test_lm_evals_result_keys_become_metrics():
    from jobs.evaluate.harness import _scores
    results = {"t": {"alias": "t", "sample_len": 12, "acc,none": 0.5, "acc_stderr,none": 0.1, "ok": True}}
    assert _scores(results) == {"t": {"acc": 0.5, "acc_stderr": 0.1}}
