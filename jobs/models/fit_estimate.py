"""A job's predicted peak GPU memory as the fit check reports it (jobs/models/fit.py computes it), and
the arithmetic between what torch allocates and what a job takes out of the card.

`max_gpu_memory_gb` bounds the job's allocated peak (torch.cuda.max_memory_allocated), the number the
bench rows and the peers' peaks are measured in (bench/README.md, ../shared/BASELINES.md); the CUDA
context and the allocator's slack come on top on the card (`total_gb`, what the queue waits for).
Until 2026-12-04 the plan held `total_gb` within the budget, 0.75 GiB + 3 % under it: budgets of
5.4 GiB (1B SFT) and 19.8 GiB (8B) were called "does not fit", and those jobs then ran at 5.0 and
19.2 GiB allocated (issue 38)."""
from __future__ import annotations

import math

from dataclasses import dataclass, field

GIB = 1024 ** 3
CUDA_CONTEXT_BYTES = int(0.75 * GIB)   # CUDA context, cuBLAS workspace, loaded kernels (not "allocated")
FRAGMENTATION = 0.03                   # caching-allocator slack over max_memory_allocated
# a budget plan keeps its predicted allocated peak this much under the budget: the estimate ran up to
# 3.5 % under the measured peaks of the budgeted preference jobs (bench/results/job.jsonl, DPO 1B 6.34
# predicted, 6.56 measured), and a job must stay within its budget + 3 %
PLAN_MARGIN = 0.02


@dataclass
class FitEstimate:
    """Predicted peak GPU memory of a job, with its parts (bytes) and the assumptions made."""

    parts: dict[str, int]
    checkpointing: str
    tokens: int
    notes: list[str] = field(default_factory=list)
    budget_gb: float = 0.0   # the job's max_gpu_memory_gb (0: none)
    layer_plan: tuple[int, bool] | None = None   # (decoder layers recomputed, inputs offloaded) of a step's parts

    @property
    def allocated_gb(self) -> float:
        return sum(self.parts.values()) / GIB

    @property
    def total_gb(self) -> float:
        return _total_gb(sum(self.parts.values()))

    @property
    def over_budget(self) -> bool:
        return bool(self.budget_gb) and sum(self.parts.values()) > allocatable_bytes(self.budget_gb)

    def breakdown(self) -> dict[str, float]:
        """Each part in GiB, largest first."""
        return {k: round(v / GIB, 3) for k, v in sorted(self.parts.items(), key=lambda kv: -kv[1])}

    def summary(self) -> str:
        parts = self.breakdown()
        shown = [k for k in parts][:4] + (["vision tower"] if "vision tower" in list(parts)[4:] else [])
        top = ", ".join(f"{k} {parts[k]:.2f}" for k in shown)
        # the allocated peak first: it is what max_gpu_memory_gb bounds and what a budgeted job is measured
        # by; the card's total (context and slack on top) once read "about 5.9 GiB" for a job planned at
        # 4.96 within 5.44 (measured 4.955, bench/results/grpo.jsonl, 2026-12-05), as if over its budget
        budget = f" (max_gpu_memory_gb {self.budget_gb:g})" if self.budget_gb else ""
        return (f"about {self.allocated_gb:.2f} GiB allocated at peak{budget}: {top} GiB; {self.tokens:,} tokens "
                f"a micro-batch; checkpointing {self.checkpointing}; about {self.total_gb:.1f} GiB of the GPU "
                f"with the CUDA context and allocator slack")

    def as_dict(self) -> dict:
        return {"total_gb": round(self.total_gb, 2), "allocated_gb": round(self.allocated_gb, 2),
                "breakdown_gb": self.breakdown(), "checkpointing": self.checkpointing,
                "tokens": self.tokens, "notes": self.notes, "budget_gb": self.budget_gb}

    def fits(self, free_gb: float) -> bool:
        return self.total_gb <= free_gb


def _total_gb(allocated_bytes: int) -> float:
    """What a job takes out of the card for this much allocated: allocator slack and CUDA context."""
    return allocated_bytes / GIB * (1 + FRAGMENTATION) + CUDA_CONTEXT_BYTES / GIB


def allocatable_bytes(budget_gb: float) -> int:
    """The most a plan may predict to allocate within a budget of `budget_gb` (module doc; PLAN_MARGIN)."""
    return max(0, int(budget_gb * GIB / (1 + PLAN_MARGIN)))


def least_budget_gb(allocated_bytes: int) -> float:
    """The smallest budget (GiB, rounded up to 0.01) whose plan allows `allocated_bytes`."""
    return math.ceil(allocated_bytes * (1 + PLAN_MARGIN) / GIB * 100) / 100
