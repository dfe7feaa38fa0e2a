"""`python -m jobs.train` end to end on a tiny random-init Llama (seconds on CPU)."""
import os
import subprocess
import sys

import pytest
import torch
import yaml

from jobs.io.events import read_events, summarize
from tests.conftest import ROOT
from tests.jobs.train.job_runs import one_line, run_cli, run_job


def test_training_run_learns_and_writes_a_loadable_adapter(tmp_path, tiny_model):
    proc, out = run_job(tmp_path, "job", tiny_model)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = summarize(out)
    assert summary.start["max_steps"] == 30 and summary.final["type"] == "done"
    losses = [e["loss"] for e in summary.steps]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
    step = summary.steps[-1]
    for key in ("step", "max_steps", "epoch", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s",
                "eta_s", "rss_gb", "gpus", "step_s"):
        assert key in step, key
    assert step["tokens_per_s"] == pytest.approx(step["tokens"] / step["step_s"], rel=1e-2)
    assert [c["step"] for c in summary.checkpoints] == [10, 20, 30]   # the last step is always kept
    assert (out / "checkpoints" / "step-20" / "optim.pt").is_file()
    assert "fused kernels: off" in "\n".join(summary.start["patch_report"])
    log = (out / "train.log").read_text()  # a CLI run writes train.log too, each line once
    assert log.count("step 30/30") == 1 and log.count("done: 30 steps") == 1
    assert "step 30/30" in proc.stdout

    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    ids = torch.tensor([[1, 5, 9, 14, 20, 33]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        base_logits = base(ids).logits
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), out / "adapter")
        tuned_logits = tuned(ids).logits
    assert not torch.allclose(base_logits, tuned_logits, atol=1e-3)
    card = (out / "adapter" / "README.md").read_text()
    assert "final loss" in card and "lora_r: 16" in card
    assert (out / "adapter" / "tokenizer_config.json").is_file()


def test_accumulated_loss_is_normalised_over_all_label_tokens(tmp_path, tiny_model):
    """bs 4 x 1 and bs 2 x 2 see the same 4 rows in step one, so the loss and gradient norm must
    match: the loss is sum / (label tokens of the whole accumulated batch), not a mean of means."""
    common = dict(max_steps=1, save_steps=0, max_grad_norm=0)
    _, one = run_job(tmp_path, "one", tiny_model, batch_size=4, gradient_accumulation_steps=1, **common)
    _, two = run_job(tmp_path, "two", tiny_model, batch_size=2, gradient_accumulation_steps=2, **common)
    a, b = summarize(one).steps[0], summarize(two).steps[0]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


def test_resume_continues_from_the_checkpoint(tmp_path, tiny_model):
    _, first = run_job(tmp_path, "first", tiny_model, max_steps=20, save_steps=10)
    ckpt = first / "checkpoints" / "step-10"
    proc, resumed = run_job(tmp_path, "resumed", tiny_model, max_steps=20, resume_from=str(ckpt))
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = summarize(resumed).steps
    assert steps[0]["step"] == 11
    reference = {e["step"]: e["loss"] for e in summarize(first).steps}
    assert steps[0]["loss"] == pytest.approx(reference[11], rel=1e-3)


def test_config_errors_exit_non_zero_with_one_line_naming_the_key(tmp_path, tiny_model):
    proc, out = run_job(tmp_path, "bad", tiny_model, lora_alpha=-3)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("fusetune: config error: lora_alpha")
    assert not out.exists()


def test_data_errors_leave_an_error_event_and_the_log(tmp_path, tiny_model):
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    proc, out = run_job(tmp_path, "data", tiny_model, dataset=str(data))
    assert proc.returncode == 3
    assert "row 1" in proc.stderr and "no assistant turn" in proc.stderr
    (error,) = [e for e in read_events(out) if e["type"] == "error"]
    assert error["kind"] == "data" and "row 1" in error["message"]


def test_cli_overrides_the_yaml(tmp_path, tiny_model):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"model": str(tiny_model), "max_steps": 50}))
    out = tmp_path / "cli"
    proc = subprocess.run([sys.executable, "-m", "jobs.train", str(config), "--max_steps", "2",
                           "--output_dir", str(out), "--save_steps", "0", "--max_seq_length", "64"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summarize(out).start["max_steps"] == 2
    assert yaml.safe_load((out / "config.yaml").read_text())["max_steps"] == 2


def test_fused_kernels_on_cpu_fall_back_and_say_why(tmp_path, tiny_model):
    proc, out = run_job(tmp_path, "fused", tiny_model, fused_kernels=True, max_steps=3, save_steps=0,
                        gradient_checkpointing="offload")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = "\n".join(summarize(out).start["patch_report"])
    assert "backend=torch" in report and "no CUDA device" in report
    assert "checkpointing:" in report
    assert "cuda graph: off (the job runs on cpu)" in report
    log = (out / "train.log").read_text() if (out / "train.log").exists() else proc.stdout
    assert "no CUDA device" in log


def test_qlora_job_trains_with_4bit_base_weights(tmp_path, tiny_model):
    proc, out = run_job(tmp_path, "qlora", tiny_model, load_in_4bit=True, max_steps=12, save_steps=0)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "4-bit NF4 base weights" in proc.stdout
    losses = [e["loss"] for e in summarize(out).steps]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    from peft import PeftConfig
    assert PeftConfig.from_pretrained(out / "adapter").r == 16


def test_a_config_that_is_not_utf8_is_refused_in_one_line(tmp_path):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("model: caf\xe9\n".encode("latin-1"))
    proc = run_cli(str(config))
    assert proc.returncode == 2
    assert one_line(proc.stderr) == (f"fusetune: config error: {config} is not UTF-8 text (byte 10 is 0xe9): "
                                     "save it as UTF-8")


def test_an_unwritable_output_dir_is_one_line_naming_the_path_and_the_fix(tmp_path, tiny_model):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = run_cli("--model", str(tiny_model), "--output_dir", str(blocker / "out"), "--data-dir", str(tmp_path))
    assert proc.returncode == 5
    line = one_line(proc.stderr)
    assert line.startswith(f"fusetune: cannot write {blocker / 'out'}: Not a directory (") and "output_dir" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_dir_is_one_line(tmp_path, tiny_model):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    proc = run_cli("--model", str(tiny_model), "--output_dir", str(locked), "--data-dir", str(tmp_path / "d"))
    assert proc.returncode == 5
    assert one_line(proc.stderr).startswith(f"fusetune: cannot write {locked}") and "Permission denied" in proc.stderr


def test_an_unusable_data_dir_is_one_line(tmp_path, tiny_model):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = run_cli("--model", str(tiny_model), "--output_dir", str(tmp_path / "out"),
                   "--data-dir", str(blocker / "data"))
    assert proc.returncode == 5
    assert one_line(proc.stderr).startswith(f"fusetune: cannot write {blocker / 'data'}: Not a directory")


def test_the_data_dir_reaches_the_trainer(tmp_path, tiny_model, monkeypatch, in_process_cli):
    from jobs.train import cli as train
    from jobs.train import loop as trainer
    seen = {}

    class RecordingTrainer:
        def __init__(self, spec, job_dir, events, data_dir=None, log=print, dist=None):
            seen.update(data_dir=data_dir, job_dir=job_dir)
            self.step, self.stop_requested = 0, False

        def run(self):
            return None
    monkeypatch.setattr(trainer, "Trainer", RecordingTrainer)
    data = tmp_path / "data"
    assert train.main(["--model", str(tiny_model), "--output_dir", str(tmp_path / "out"), "--data-dir", str(data)]) == 0
    assert seen == {"data_dir": data, "job_dir": tmp_path / "out"}
    assert os.environ["HF_HOME"] == str(data / "cache" / "huggingface")  # library caches follow it
    assert (tmp_path / "out" / "config.yaml").stat().st_mode & 0o777 == 0o600
