"""A step's numbers on their way to the host, and the learning-rate schedule (jobs/train/loop.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class PendingStep:
    """A step whose numbers are still on the GPU: [loss, grad_norm] copied into pinned memory."""
    values: torch.Tensor
    done: object            # a CUDA event recorded after the copy (None on CPU)
    tokens: int
    epoch: float
    lr: float

    def read(self) -> tuple[float, float]:
        if self.done is not None:
            self.done.synchronize()
        loss, grad_norm = self.values.tolist()
        return loss, grad_norm


def cosine_with_warmup(warmup: int, total: int):
    """LR multiplier: linear warm-up, then cosine decay to 0 (the usual HF schedule)."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor
