"""Which per-token log-probs op a method's loss runs, and the kernel report's line that says so.

The preference methods and GRPO both score label tokens through the LM head. With fused_kernels
on, the fused op (kernels/ops/fused_linear_logprobs.py: chunked, never the N x V logits) runs where
Triton can; with it off, the PyTorch reference runs everywhere, as the log's "fused kernels: off"
promises (GRPO used to run the fused op regardless, which under TRITON_INTERPRET made a CPU job
interpret Triton, several times slower)."""
from __future__ import annotations

import torch

from kernels.ops.fused_linear_logprobs import (fused_linear_logprobs, fused_linear_logprobs_reference,
                                               kernel_unavailable_reason)


def logprobs_op(fused: bool):
    """fused_linear_logprobs or its PyTorch reference (the same arguments, the same result)."""
    return fused_linear_logprobs if fused else fused_linear_logprobs_reference


def op_line(fused: bool, device: torch.device, what: str) -> str:
    """The kernel report's line for the log-probs op: which path runs, and why; `what` says what the
    fused path saves for this method."""
    if not fused:
        return "  torch   fused_linear_logprobs: fused_kernels is off (full logits, PyTorch)"
    reason = kernel_unavailable_reason(torch.empty(0, device=device))
    if reason:
        return f"  torch   fused_linear_logprobs: {reason}"
    return f"  triton  fused_linear_logprobs ({what})"


def report_op(trainer, what: str) -> None:
    """The op's line into the trainer's kernel report (the start event) and its log."""
    line = op_line(trainer.spec.fused_kernels, trainer.device, what)
    trainer.patch_report.append(line)
    trainer.log(line)
