"""A DPO job through `python -m jobs.train` on a tiny Llama: it learns its pairs (reward accuracy
and margin rise), reports them in step and eval events, and its adapter exports like an SFT one;
a KTO job reports its KL estimate."""
import json
import zipfile

from jobs.export import export_adapter_zip
from jobs.io.events import summarize
from tests.jobs.train.job_runs import run_job
from tests.jobs.train.method_jobs import PAIRS

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


def test_two_processes_give_the_update_of_one(tmp_path, tiny_model):
    """DPO's loss is normalised per pair over the global batch and the forward goes through DDP:
    2 processes x 2 pairs train exactly as 1 process x 4 pairs."""
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in PAIRS) + "\n")
    common = dict(method="dpo", dataset=str(data), max_steps=2, learning_rate=5e-3, save_steps=0, max_seq_length=64)
    _, one = run_job(tmp_path, "one", tiny_model, batch_size=4, **common)
    _, two = run_job(tmp_path, "two", tiny_model, batch_size=2, processes=2, **common)
    a, b = summarize(one).steps, summarize(two).steps
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) < 1e-5 and abs(x["grad_norm"] - y["grad_norm"]) < 1e-4 * x["grad_norm"]
        assert abs(x["reward_margin"] - y["reward_margin"]) < 1e-5


def test_kto_step_and_eval_events_carry_the_kl_estimate(tmp_path, tiny_model):
    """KTO's reference point z0 (kto_kl, the mean policy - reference log-ratio of mismatched examples,
    clamped at 0) rides in every step and eval event: 0 at the first step, where the adapter's B = 0
    makes the policy the reference, and the loss there is 0.5 an example (1 - sigmoid(0)). Within 1e-5,
    not exactly 0: with KTO_HALVES the policy's KL completions run on their own (pairs.py KTOBatch), the
    reference's beside their prompt, and the two layouts round apart (fp32: ~1e-6)."""
    rows = [{"prompt": p["prompt"], "completion": answer, "label": label}
            for p in PAIRS for answer, label in ((p["chosen"], True), (p["rejected"], False))]
    data = tmp_path / "kto.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    proc, out = run_job(tmp_path, "kto", tiny_model, method="kto", dataset=str(data), eval_dataset=str(data),
                        max_steps=4, learning_rate=5e-3, save_steps=0, max_seq_length=64)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = summarize(out)
    steps = summary.steps
    assert len(steps) == 4 and all("kto_kl" in s for s in steps), steps
    assert steps[0]["kto_kl"] < 1e-5 and abs(steps[0]["loss"] - 0.5) < 1e-4
    assert all(s["kto_kl"] >= 0.0 for s in steps)
    assert max(s["kto_kl"] for s in steps[1:]) > 0.0   # measured, not a constant: it moves once the adapter does
    assert summary.evals[-1]["eval_kto_kl"] > 0.0
