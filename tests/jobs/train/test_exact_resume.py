"""Resume is bit-exact with LoRA dropout on (issue 23 item 4): a checkpoint keeps every rank's random
state (Python, NumPy, torch CPU, CUDA) and the data order, so the steps after it draw the same
dropout masks and see the same examples as the unbroken run, in one process and with two."""
import torch

from jobs.train.checkpoints import latest_checkpoint
from jobs.io.events import summarize
from jobs.train.rng_state import RNG_FILE
from tests.jobs.train.job_runs import adapter_weights, finish, train, write_config


def _same_after_resume(tmp_path, tiny_model, **overrides):
    config = write_config(tmp_path, "full", tiny_model, lora_dropout=0.1, max_steps=6, save_steps=3, **overrides)
    finish(train(config))
    checkpoint = tmp_path / "full" / "checkpoints" / "step-3"
    assert (checkpoint / RNG_FILE).is_file()
    resumed = tmp_path / "resumed"
    (log,) = finish(train(config, "--output_dir", str(resumed), "--resume_from", str(checkpoint)))
    assert "random state" not in log and "data order differs" not in log  # no note: everything was restored
    full, again = summarize(tmp_path / "full"), summarize(resumed)
    assert [s["step"] for s in again.steps] == [4, 5, 6]
    assert [s["loss"] for s in again.steps] == [s["loss"] for s in full.steps[3:]]  # exactly, not approx
    got, want = adapter_weights(resumed), adapter_weights(tmp_path / "full")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    return full


def test_one_process_resumes_bit_exactly_with_dropout(tmp_path, tiny_model):
    full = _same_after_resume(tmp_path, tiny_model)
    assert full.start["processes"] == 1


def test_two_gloo_processes_resume_bit_exactly_with_dropout(tmp_path, tiny_model):
    full = _same_after_resume(tmp_path, tiny_model, processes=2)
    assert full.start["processes"] == 2
    per_rank = torch.load(latest_checkpoint(tmp_path / "full") / RNG_FILE, weights_only=True)
    assert len(per_rank) == 2 and not torch.equal(per_rank[0]["torch"], per_rank[1]["torch"])


def test_a_resume_on_changed_data_or_process_count_says_so(tmp_path, tiny_model):
    config = write_config(tmp_path, "full", tiny_model, lora_dropout=0.1, max_steps=4, save_steps=2)
    finish(train(config))
    checkpoint = tmp_path / "full" / "checkpoints" / "step-2"
    (log,) = finish(train(config, "--output_dir", str(tmp_path / "b"), "--resume_from", str(checkpoint),
                          "--seed", "4"))
    assert "the data order differs from the checkpoint's" in log
    (checkpoint / RNG_FILE).unlink()
    (log,) = finish(train(config, "--output_dir", str(tmp_path / "c"), "--resume_from", str(checkpoint)))
    assert "this checkpoint keeps no random state" in log
