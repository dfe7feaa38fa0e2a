"""kernels/step_graph.py refuses what it cannot capture, with the reason. The capture itself needs a
GPU: bench/gpu_check.py `step_graph[bf16|fp8]` runs 4 steps eager and captured from the same init
and compares losses and adapters (bitwise equal on the H200, bench/results/gpu_check.jsonl)."""
from __future__ import annotations

import pytest
import torch

from kernels.step_graph import StepGraph


def _model_and_batch():
    model = torch.nn.Linear(4, 4)
    return model, {"input_ids": torch.zeros(1, 4, dtype=torch.long)}


@pytest.mark.parametrize("optimizer, warmup, expected", [
    (lambda p: torch.optim.AdamW(p, capturable=False), 1, "capturable=True"),
    (lambda p: torch.optim.AdamW(p), 1, "capturable=True"),
    (lambda p: torch.optim.AdamW(p, capturable=True), 0, "at least one warm-up step"),
    (lambda p: torch.optim.AdamW(p, capturable=True), 1, "on a CUDA GPU; it is on cpu"),
    (lambda p: torch.optim.SGD(p, lr=0.1), 2, "on a CUDA GPU; it is on cpu"),
])
def test_what_cannot_be_captured_is_refused_with_the_reason(optimizer, warmup, expected):
    model, batch = _model_and_batch()
    with pytest.raises(ValueError, match=expected):
        StepGraph(model, optimizer(model.parameters()), batch, warmup_steps=warmup)
