"""`python -m jobs.train` on a tiny random Qwen2.5-VL and builtin:shapes (images drawn with PIL)."""
import json

from jobs.io.events import summarize
from tests.jobs.train.job_runs import run_job


def test_vision_job_learns_and_saves_the_processor_with_the_adapter(tmp_path, tiny_vision_model):
    proc, out = run_job(tmp_path, "vl", tiny_vision_model, dataset="builtin:shapes", max_steps=24,
                        batch_size=2, max_seq_length=128, save_steps=0, learning_rate=3e-3, packing="off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = summarize(out)
    losses = [e["loss"] for e in summary.steps]
    assert len(losses) == 24
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4, losses
    report = "\n".join(summary.start["patch_report"])
    assert "LoRA modules: language 14/14, vision 0/10, projector 0/2 (vision and projector frozen)" in report
    adapter = out / "adapter"
    assert (adapter / "preprocessor_config.json").is_file() and (adapter / "tokenizer_config.json").is_file()
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert all("language_model" in name for name in config["target_modules"]), config["target_modules"]
    log = (out / "train.log").read_text()
    assert "image tokens (never trained" in log and "packing: off" in log


def test_vision_lora_covers_the_vision_tower_and_projector(tmp_path, tiny_vision_model):
    proc, out = run_job(tmp_path, "vl-all", tiny_vision_model, dataset="builtin:shapes", max_steps=2,
                        batch_size=2, max_seq_length=128, save_steps=0, vision_lora=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = "\n".join(summarize(out).start["patch_report"])
    assert "LoRA modules: language 14/14, vision 10/10, projector 2/2" in report


def test_packed_vision_job_learns(tmp_path, tiny_vision_model):
    """packing: on puts several image-text examples in each row (jobs/data/vision_packing.py): the
    job trains through the patched model with its packed positions, and the loss falls."""
    proc, out = run_job(tmp_path, "vl-packed", tiny_vision_model, dataset="builtin:shapes", max_steps=16,
                        batch_size=1, max_seq_length=384, save_steps=0, learning_rate=3e-3, packing="on",
                        eval_fraction=0.1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = summarize(out)
    losses = [e["loss"] for e in summary.steps]
    assert len(losses) == 16
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4, losses
    log = (out / "train.log").read_text()
    assert "packing: on" in log and "image-text examples packed into" in log, log
    rows = int(log.split("image-text examples packed into ")[1].split()[0])
    examples = int(log.split(" image-text examples packed into")[0].rsplit(maxsplit=1)[-1])
    assert rows < examples / 2, log   # rows of 384 hold several ~100-token examples
