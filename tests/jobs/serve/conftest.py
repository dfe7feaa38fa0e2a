"""A real `python -m jobs.serve` on 127.0.0.1 (a free port the server picks) serving the tiny Llama,
its trained job (tests/jobs/conftest.py `tiny_job`) and a second job whose adapter differs, shared
by the module's tests."""
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT

API_KEY = "sk-fusetune-test"
URL_LINE = re.compile(r"serving \d+ models at (http://\S+/v1)")


@pytest.fixture(scope="session")
def second_job(tiny_job, tmp_path_factory):
    """A copy of the trained job with other LoRA B weights: a second adapter on the same base."""
    import torch
    from safetensors.torch import load_file, save_file

    job = tmp_path_factory.mktemp("jobs-b") / "llama-job-b"
    shutil.copytree(tiny_job, job, ignore=shutil.ignore_patterns("checkpoints"))
    weights_file = job / "adapter" / "adapter_model.safetensors"
    weights = load_file(str(weights_file))
    generator = torch.Generator().manual_seed(7)
    for name, tensor in weights.items():
        if "lora_B" in name:
            weights[name] = torch.randn(tensor.shape, generator=generator) * 0.5
    save_file(weights, str(weights_file))
    return job


def start_server(job_dirs, *extra: str, timeout: float = 180.0):
    """(process, base URL) once the server printed its line; the process is stopped by the caller."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("FUSETUNE_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "jobs.serve", *map(str, job_dirs), "--port", "0", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        match = URL_LINE.search(line)
        if match:   # keep reading, so the server never blocks on a full pipe
            threading.Thread(target=seen.extend, args=(proc.stdout,), daemon=True).start()
            return proc, match.group(1)
    proc.kill()
    raise AssertionError("the server did not start:\n" + "".join(seen[-30:]))


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def keys_file(tmp_path_factory):
    """The server's key store (jobs/serve/keys.py), as the Chat tab's Serve panel keeps one."""
    return tmp_path_factory.mktemp("keys") / "api-keys.json"


@pytest.fixture(scope="session")
def server(tiny_job, second_job, keys_file):
    proc, url = start_server([tiny_job, second_job], "--api-key", API_KEY, "--keys-file", str(keys_file))
    yield url
    stop(proc)


@pytest.fixture
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server, api_key=API_KEY, max_retries=0, timeout=120)
