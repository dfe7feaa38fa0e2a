"""A DPO job through `python -m jobs.train` on a tiny Llama: it learns its pairs (reward accuracy
and margin rise), reports them in step and eval events, and its adapter exports like an SFT one."""
import json
import zipfile

from jobs.export import export_adapter_zip
from jobs.io.events import summarize
from tests.jobs.test_train import run_job

PAIRS = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{2 * i}.",
          "rejected": f"Hmm, it could be {2 * i + 1}, or maybe not; hard to say."} for i in range(12)]


def test_a_short_dpo_job_raises_reward_accuracy_and_margin_and_exports(tmp_path, tiny_model):
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in PAIRS) + "\n")
    proc, out = run_job(tmp_path, "dpo", tiny_model, method="dpo", dataset=str(data), eval_dataset=str(data),
                        max_steps=12, learning_rate=5e-3, save_steps=0, max_seq_length=64)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = summarize(out)
    steps = summary.steps
    first, last = steps[0], steps[-3:]
    assert abs(first["loss"] - 0.6931) < 1e-3 and first["reward_margin"] == 0.0
    assert sum(s["reward_margin"] for s in last) / 3 > 1.0, [s["reward_margin"] for s in steps]
    assert sum(s["reward_accuracy"] for s in last) / 3 > 0.9 > first["reward_accuracy"]
    assert all(s["rejected_reward"] < s["chosen_reward"] for s in last)
    evaluation = summary.evals[-1]
    assert evaluation["eval_reward_accuracy"] > 0.9 and evaluation["eval_reward_margin"] > 1.0
    assert evaluation["eval_loss"] < 0.5 * first["loss"]
    assert any("fused_linear_logprobs" in line for line in summary.start["patch_report"])
    archive = export_adapter_zip(out)   # a normal PEFT adapter: it exports as SFT's do
    assert "adapter_model.safetensors" in " ".join(zipfile.ZipFile(archive).namelist())
