"""kernels/step_graph.py refuses what it cannot capture, with the reason. The capture itself needs a
GPU: bench/gpu_check.py `step_graph[bf16|fp8]` runs 4 steps eager and captured from the same init
and compares losses and adapters (bitwise equal on the H200, bench/results/gpu_check.jsonl)."""
from __future__ import annotations

import pytest
import torch

from kernels.step_graph import StepGraph, capturable_reason, language_model_step


def test_a_non_capturable_optimizer_is_refused_before_the_device():
    model = torch.nn.Linear(4, 4)
    for optimizer in (torch.optim.AdamW(model.parameters()), torch.optim.AdamW(model.parameters(), capturable=False)):
        with pytest.raises(ValueError, match="capturable=True"):
            language_model_step(model, optimizer)


def test_a_cpu_model_is_refused_with_the_reason():
    model = torch.nn.Linear(4, 4)
    assert capturable_reason(model, torch.optim.SGD(model.parameters(), lr=0.1)) == \
        "a CUDA graph needs the model on a CUDA GPU; it is on cpu"


def test_cpu_inputs_and_no_warm_up_are_refused():
    with pytest.raises(ValueError, match="at least one warm-up step"):
        StepGraph(lambda inputs: inputs["x"], {"x": torch.zeros(2)}, warmup_steps=0)
    with pytest.raises(ValueError, match="must be on a CUDA GPU"):
        StepGraph(lambda inputs: inputs["x"], {"x": torch.zeros(2), "n": 3})


def test_every_capture_warms_up_on_one_stream_per_device(monkeypatch):
    """A new stream per capture left a 32 MiB cuBLAS workspace behind each time (GRPO captures a
    decode step per rollout: +1 GiB over 32 steps on the H200); warmup_stream makes one per device."""
    from kernels import step_graph
    made = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda index: made.append(index) or f"stream {index}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(step_graph, "_WARMUP_STREAMS", {})
    streams = [step_graph.warmup_stream(device) for device in (None, "cuda:0", "cuda", "cuda:1", "cuda:1")]
    assert made == [0, 1] and streams == ["stream 0"] * 3 + ["stream 1"] * 2
