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
