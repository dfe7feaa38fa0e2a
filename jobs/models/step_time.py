"""How long a job will take on this CPU, from one measured training step.

The fit check on a machine without a GPU says how much RAM the job needs (jobs/models/fit.py) and,
from here, about how long it runs: the chosen model with the job's LoRA is loaded as the trainer
loads it (jobs/train/loop.py: load_base_model, add_lora), a short batch goes forward and backward
(one warm-up step, then MEASURED_STEPS timed ones), and the time per token is scaled by the job's
tokens (rows per step x tokens per row x steps). Linear in tokens: at the short rows of a
fine-tuning set the matrix products dominate, and attention's quadratic share is small; the
estimate says "about". The caller caches the answer per model and LoRA shape (studio/start_check.py).
"""
from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass

from jobs.spec import JobSpec

MEASURE_TOKENS = 64    # one row of this many tokens: a second or two on a laptop core for a 135M model
MEASURED_STEPS = 2
# A recomputed layer runs its forward twice: about 4/3 of a plain step (forward 1, backward 2).
RECOMPUTE_FACTOR = 4 / 3


def measure_key(spec: JobSpec, source: str) -> tuple:
    """What the time per token depends on: the model, its dtype and quantisation, the LoRA shape."""
    targets = spec.target_modules
    return (source, spec.dtype, spec.load_in_4bit, spec.lora_r,
            tuple(targets) if isinstance(targets, (list, tuple)) else str(targets))


def seconds_per_token(spec: JobSpec, source: str, tokens: int = MEASURE_TOKENS) -> float:
    """Wall seconds per trained token of a forward+backward step of `spec`'s model on this CPU."""
    import torch
    from jobs.models import load as models
    device = torch.device("cpu")
    base = models.load_base_model(source, models.pick_dtype(spec, device), device, spec.load_in_4bit)
    model = models.add_lora(base, spec)
    ids = torch.randint(0, int(model.config.vocab_size), (1, tokens), generator=torch.Generator().manual_seed(0))
    timings = []
    try:
        for step in range(MEASURED_STEPS + 1):   # step 0 warms the allocator and the kernels: not counted
            began = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            if step:
                timings.append(time.perf_counter() - began)
            model.zero_grad(set_to_none=True)
    finally:
        del model, base
        gc.collect()
    return sum(timings) / len(timings) / tokens


@dataclass
class TimeEstimate:
    seconds: float          # the whole job
    step_seconds: float
    steps: int
    tokens_per_row: int
    rows_measured: bool     # tokens_per_row from the job's own data (else max_seq_length: an upper bound)


def estimate_time(spec: JobSpec, per_token: float, tokens_per_row: float | None = None,
                  rows: int | None = None) -> TimeEstimate | None:
    """The job's time from `per_token`: its steps (max_steps, or epochs over `rows`) of batch_size x
    gradient_accumulation_steps rows of `tokens_per_row` (the data's mean; max_seq_length when
    unknown). None when the steps cannot be known (epochs without a row count)."""
    if spec.max_steps > 0:
        steps = spec.max_steps
    elif rows:
        steps = max(1, math.ceil(math.ceil(rows / spec.batch_size) / spec.gradient_accumulation_steps
                                 * spec.num_epochs))
    else:
        return None
    # packed rows are full (packing "auto" is off on a CPU); unpacked ones are as long as the data's
    measured = bool(tokens_per_row) and spec.packing != "on"
    per_row = min(max(1, int(round(tokens_per_row))), spec.max_seq_length) if measured else spec.max_seq_length
    step = per_token * spec.batch_size * spec.gradient_accumulation_steps * per_row
    if spec.gradient_checkpointing == "on":   # "auto" is off on a CPU (jobs/train/loop.py)
        step *= RECOMPUTE_FACTOR
    return TimeEstimate(step * steps, step, steps, per_row, measured)


def main() -> int:
    """`python -m jobs.models.step_time` with {"spec": ..., "source": ...} as JSON on stdin: the
    measurement in a process of its own (the studio's memory stays flat and its threads free);
    the last line of stdout is {"seconds_per_token": x}."""
    import json
    import sys
    request = json.loads(sys.stdin.read())
    per_token = seconds_per_token(JobSpec.from_dict(request["spec"]), request["source"])
    print(json.dumps({"seconds_per_token": per_token}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
