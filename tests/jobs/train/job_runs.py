"""Running whole training jobs in tests: a job's config, `python -m jobs.train` as a subprocess, and the
checks that two runs trained the same (shared by the data-parallel, sharded, GRPO, Ray and resume tests)."""
import os
import socket
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from jobs.io.events import summarize
from jobs.io.layout import ADAPTER_WEIGHTS, JobLayout
from tests.conftest import ROOT

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


def job_yaml(tmp_path, name, config: dict):
    """The job's config as tmp_path/NAME.yaml, its output folder tmp_path/NAME."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / name), **config}))
    return path


def write_config(tmp_path, name, model, **overrides):
    """A short job (8 steps) with the data-parallel comparisons' defaults."""
    return job_yaml(tmp_path, name, {"model": str(model), "max_steps": 8, "learning_rate": 2e-3, "batch_size": 2,
                                     "max_seq_length": 64, "save_steps": 0, "seed": 3, "warmup_steps": 2,
                                     **overrides})


def train(config, *extra):
    return subprocess.Popen([sys.executable, "-m", "jobs.train", str(config), *extra], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(*procs):
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-3000:]
    return outputs


def adapter_weights(job_dir):
    """The finished adapter's tensors of a job folder (or of a checkpoint, laid out the same)."""
    return load_file(str(JobLayout(job_dir).adapter / ADAPTER_WEIGHTS))


def assert_same_training(two, one, steps):
    """Two job folders trained the same: per-step losses, tokens, and the LoRA weights: each tensor
    within 1e-3 relative, every element within 25 % of one AdamW step (lr 2e-3). Why not a flat 1e-5:
    the ranks sum gradients in another order, and where a coordinate's gradient is near zero Adam's
    m / sqrt(v) turns that rounding into a visible share of a step (seen: one element of 1,024 off
    by 2e-5 on an AMD EPYC host, the tensor within 9e-6; and on a fresh CI clone of 2026-12-05 a
    LoRA tensor 2.8e-4 off in norm after 6 steps, an element 9.3e-5 (4.6 % of a step), the same on
    every rerun on that host: a B matrix that starts at zero is small, so a few elements a fraction of
    a step apart weigh in its norm). A wrong gradient moves most elements by whole steps, and the
    losses must agree within 1e-5 at every step."""
    run2, run1 = summarize(two), summarize(one)
    assert [s["loss"] for s in run2.steps] == pytest.approx([s["loss"] for s in run1.steps], rel=1e-5)
    assert [s["tokens"] for s in run2.steps] == [s["tokens"] for s in run1.steps]
    assert [s["tokens_per_s"] > 0 for s in run2.steps] == [True] * steps
    got, want = adapter_weights(two), adapter_weights(one)
    assert got.keys() == want.keys()
    assert max(((got[k] - want[k]).norm() / want[k].norm()).item() for k in got) < 1e-3
    assert max((got[k] - want[k]).abs().max().item() for k in got) < 0.25 * 2e-3
    assert max(want[k].abs().max().item() for k in want if "lora_B" in k) > 1e-3  # it did train
    assert run2.final["type"] == "done" and len(run2.steps) == steps  # one writer: rank 0
    return run2, run1


def run_job(tmp_path, name, model, **overrides):
    """`python -m jobs.train` on `model` with the tests' small defaults (30 steps): (the process, the job folder)."""
    path = job_yaml(tmp_path, name, {"model": str(model), "max_steps": 30, "learning_rate": 1e-2, "batch_size": 4,
                                     "max_seq_length": 96, "save_steps": 10, "seed": 1, **overrides})
    return run_cli(str(path), "--data-dir", str(tmp_path / "data"), timeout=600), tmp_path / name


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m jobs.train` with these arguments, its output captured."""
    return subprocess.run([sys.executable, "-m", "jobs.train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def one_line(stderr: str) -> str:
    """The whole of stderr, which must be one line and no traceback."""
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    return stderr.strip()
