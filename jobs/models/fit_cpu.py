"""The RAM a job needs on a machine without a GPU: what the Train tab's fit check shows there.

The job's tensors are the GPU estimate's (jobs/models/fit.py, `cuda=False`: fp32 under dtype auto,
the PyTorch path), sized as the CPU trainer runs: `gradient_checkpointing: auto` is off on a CPU
(jobs/train/loop.py `_torch_checkpointing`), so every layer keeps its activations, and a micro-batch is
as wide as its longest row, which the data's measured token lengths say (the Start check's statistics:
a text row, a preference pair's longer side, a GRPO prompt), else max_seq_length. On top: the Python
process with torch, transformers, PEFT and the tokenizer loaded, measured on this project's machine.

Until issue 40 item 4 the fit check counted every layer recomputed and 0.5 GiB for the process, and said
1.7 GiB for the identity and DPO demos (measured 2.2-2.4 and 3.1-3.3 GB) and 4.2 for GRPO (measured 7.4-7.6):
bench/cpu_memory.py measures the three demos, bench/results/cpu_memory.jsonl holds the figures and
tests/jobs/models/test_fit_cpu.py keeps the prediction of each within 20 % of its peak."""
from __future__ import annotations

import dataclasses

from jobs.models.fit_estimate import GIB, FitEstimate

# RSS of `python -m jobs.train` with torch, transformers, peft, the trainer and a tokenizer imported
# and loaded, before the model: 0.55 GiB measured (torch 2.13 CPU, transformers 5, Python 3.11)
RUNTIME_BYTES = int(0.55 * GIB)
RUNTIME_PART = "Python, torch and the tokenizer"


def estimate_ram(spec, model_config, row_tokens: int | None = None) -> FitEstimate:
    """Predicted peak RSS of `spec` on the CPU. `row_tokens`: the data's longest row in tokens (a
    pair's longer side; a GRPO prompt), when measured; at most max_seq_length counts."""
    from jobs.models.fit import estimate_peak
    view = as_cpu_runs(spec, row_tokens)
    estimate = estimate_peak(view, model_config, cuda=False, fused=False, free_bytes=0, total_bytes=0)
    parts = {**estimate.parts, RUNTIME_PART: RUNTIME_BYTES}
    notes = estimate.notes + ([f"rows of up to {view.max_seq_length} tokens, as measured in the data"]
                              if view.max_seq_length < spec.max_seq_length else [])
    return FitEstimate(parts, "off (a CPU job keeps every layer's activations)" if view.gradient_checkpointing == "off"
                       else estimate.checkpointing, estimate.tokens, notes)


def as_cpu_runs(spec, row_tokens: int | None = None):
    """`spec` as the CPU trainer runs it: checkpointing auto is off there; rows as long as measured."""
    changes = {}
    if spec.gradient_checkpointing == "auto":
        changes["gradient_checkpointing"] = "off"
    if row_tokens and 0 < int(row_tokens) < spec.max_seq_length:
        changes["max_seq_length"] = int(row_tokens)
    return dataclasses.replace(spec, **changes) if changes else spec
