"""What would lower a job's predicted peak GPU memory, and the out-of-memory error's message
(split from jobs/models/fit.py, which re-exports both)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.models.fit_estimate import FitEstimate

GIB = 1024 ** 3


def advice(spec, estimate: FitEstimate | None) -> list[str]:
    """What would lower the peak, largest lever first."""
    tips = []
    if spec.batch_size > 1:
        tips.append(f"batch_size {spec.batch_size} -> {max(1, spec.batch_size // 2)} "
                    f"(with gradient_accumulation_steps {spec.gradient_accumulation_steps * 2} for the same step)")
    if spec.max_seq_length > 512:
        tips.append(f"max_seq_length {spec.max_seq_length} -> {spec.max_seq_length // 2}")
    if estimate is None or not estimate.checkpointing.startswith(("on", "offload")):
        tips.append("gradient_checkpointing: on (or offload: layer inputs in CPU memory)")
    elif estimate.checkpointing == "on":
        tips.append("gradient_checkpointing: offload (layer inputs in CPU memory)")
    if not spec.load_in_4bit:
        tips.append("load_in_4bit: true (QLoRA: base weights in 4-bit)")
    if not spec.fused_kernels:
        tips.append("fused_kernels: true (the fused engine keeps far fewer activations)")
    return tips


def oom_message(spec, estimate: FitEstimate | None, peak_bytes: int, step: int, policy: str, error: str) -> str:
    """The `oom` error event's message: what was predicted, what was seen, what to change."""
    predicted = f"predicted peak {estimate.total_gb:.1f} GiB" if estimate else "no prediction for this model"
    first = error.splitlines()[0] if error else ""
    return (f"out of GPU memory at step {step} ({predicted}; peak allocated before the failure "
            f"{peak_bytes / GIB:.1f} GiB; {policy}). To fit: " + "; or ".join(advice(spec, estimate))
            + f". The last checkpoint is intact. CUDA said: {first[:200]}")
