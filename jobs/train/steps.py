"""A step's numbers on their way to the host, and the learning-rate schedule (jobs/train/loop.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class PendingStep:
    """A step whose numbers are still on the GPU: [loss, *metric sums, grad_norm] copied into pinned
    memory; the method's metric sums are divided by the step's normalisation count when read."""
    values: torch.Tensor
    done: object            # a CUDA event recorded after the copy (None on CPU)
    tokens: int
    epoch: float
    lr: float
    units: float = 1.0      # what the loss was normalised over (answer tokens, pairs, ...)

    def read(self) -> tuple[float, float, list[float]]:
        """(loss, grad norm, metric means)."""
        if self.done is not None:
            self.done.synchronize()
        values = self.values.tolist()
        return values[0], values[-1], [v / self.units for v in values[1:-1]]


def cosine_with_warmup(warmup: int, total: int):
    """LR multiplier: linear warm-up, then cosine decay to 0 (the usual HF schedule)."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor
