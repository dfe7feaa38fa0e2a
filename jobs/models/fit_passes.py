"""Micro-batches within `max_gpu_memory_gb`: how many of a micro-batch's units one forward and backward
takes (jobs/models/fit.py asks; jobs/data/packing.py's BatchPlan, and PairPlan over it, cut the batches).

A preference unit is a packed row (2 x max_seq_length tokens: whole pairs, or KTO examples with their KL
partner) or, unpacked, one pair (its two sequences); an SFT unit is a packed row or an example (text
models: an image-text batch is not cut). Packing is where the preference speed comes from, and a
packed micro-batch of 8 rows of 5,120 tokens on the 1B shape kept ~7.8 GiB with every layer
recomputed: no checkpointing plan could meet a 4-5 GiB budget, and the job ran over it (issue 38).
So within a budget the micro-batch may train in passes of fewer units; the loss of a step is
normalised over all its pairs (jobs/train/loop.py `count`; SFT's over all its answer tokens), so the
passes' gradients add up to the whole's (as TRL's and transformers' gradient accumulation does across
micro-batches). The same holds SFT budgets: 4 packed rows of 4,096 on the 1B shape recompute 14 of 16
layers within 5.37 GiB; a row a pass recomputes 6 (slower there: SFT_PASS_SECONDS), and fits budgets
down to 2.89 GiB where the 4 rows need 3.99.

Which split and plan: for each pass size the fastest checkpointing plan that fits (fit_plan._first_fit),
then the pair of the two with the least predicted step time: a recomputed layer repeats its forward
(about 1/n of a forward of the whole, less its MLP's down projection in the fused engine), a further pass costs its launches and host work
(PASS_SECONDS); offloading costs no step time on an H200 (bench/NOTES.md). One unit a pass with every
layer recomputed (and offloaded, and the input embeddings in host memory where the plan allows it) is
the least a job can hold: below it the budget is refused before the job starts (`least`)."""
from __future__ import annotations

import dataclasses

from jobs.spec_values import PREFERENCE_METHODS

# one more forward + backward pass of a micro-batch: launches and Python of 16-32 layers forward,
# backward and (DPO, KTO) the reference forward; the 1B DPO step of one row kept the GPU 76 % busy
# in 0.143 s (bench/NOTES.md, session 30), ~0.035 s of host time
PASS_SECONDS = 0.03
# SFT's further pass costs about what a preference one does (bench/results/sft_passes_ab.jsonl, one
# H100, 2026-12-06): 1B, 4 rows of 4,096 within 5.37 GiB, a row a pass (6 of 16 layers recomputed)
# took 0.332 s a step against 0.291 whole (14 of 16): the 8 layer forwards saved (~0.04 s) bought three
# passes at ~0.026 s each; 8B, 2 rows within 19.8, a row a pass (24 of 32) 0.715-0.719 s against 0.739
# whole (29 of 32), 19.40 GiB measured (19.36 predicted). The model chose the faster side of both.
# The bench switch sftpasses (bench_fp8.SWITCHES) charges 0.003 s, for an A/B against the whole.
SFT_PASS_SECONDS = PASS_SECONDS
# the bf16 GEMM rate a LoRA step reaches on an H200: about half of the 790 TFLOP/s peak
# (../shared/BASELINES.md: 44-64 % useful MFU for the 8B rows)
STEP_FLOPS = 400e12


def splits(spec, vision=None) -> bool:
    """Whether this job's micro-batch may train in passes: the preference methods, and SFT on a text
    model (`vision`: fit_vision.VisionShape of an image-text model, whose batches are not cut)."""
    return spec.method in PREFERENCE_METHODS or (spec.method == "sft" and vision is None)


def pass_sizes(units: int) -> list[int]:
    """Each distinct largest pass size of `units` split into 1, 2, ... passes, largest first."""
    return sorted({-(-units // passes) for passes in range(1, units + 1)}, reverse=True)


def step_seconds(spec, shape, part: int, recomputed: int) -> float:
    """Predicted time of one micro-batch in passes of `part` units with `recomputed` layers of `shape`
    (fit_shape._Shape) recomputed: only the parts that differ between plans are counted right."""
    forwards = 3 + (spec.method in ("dpo", "kto") and not spec.precompute_reference)   # + the reference
    forward = 2 * shape.linear_weights() * spec.batch_tokens() / STEP_FLOPS
    passes = -(-spec.batch_size // part)
    each = SFT_PASS_SECONDS if spec.method == "sft" else PASS_SECONDS
    redo = shape.recompute_share(spec.fused_kernels)   # the down projection is skipped (kernels/lora_patch.py)
    return forward * (forwards + redo * recomputed / max(shape.layers, 1)) + passes * each


def choose(spec, shape, fits) -> tuple[int, tuple | None]:
    """(units a pass, the plan fit_plan._first_fit found for it) with the least step_seconds;
    `fits(view)` is that search for a spec whose micro-batch is one pass. (1, None) when no pass
    size fits at all."""
    best = None
    for part in pass_sizes(spec.batch_size):
        found = fits(dataclasses.replace(spec, batch_size=part))
        if found is None:
            continue
        cost = step_seconds(spec, shape, part, found[0])
        if best is None or cost < best[0]:
            best = (cost, part, found)
    return (best[1], best[2]) if best else (1, None)


def unit_name(spec, packed: bool | None, count: int) -> str:
    """What a pass is counted in: packed rows, or pairs (KTO, SFT: examples)."""
    if packed:
        return "packed row" if count == 1 else "packed rows"
    word = "example" if spec.method in ("kto", "sft") else "pair"
    return word if count == 1 else word + "s"


def smallest_view(spec, vision=None):
    """The job's smallest pass: one unit (preference, text SFT), one completion (GRPO's policy step),
    else itself."""
    if splits(spec, vision):
        return dataclasses.replace(spec, batch_size=1)
    if spec.method == "grpo":
        return dataclasses.replace(spec, batch_size=1, num_generations=1)
    return spec


def smallest_pass(spec, vision=None) -> str:
    """The smallest pass of this job in words (the refusal's "how")."""
    if splits(spec, vision) and spec.method == "sft":
        return f"one example or packed row ({spec.max_seq_length:,} tokens at most) a pass"
    if splits(spec, vision):
        word = "example" if spec.method == "kto" else "pair"
        return f"one {word} or packed row ({2 * spec.max_seq_length:,} tokens at most) a pass"
    if spec.method == "grpo":
        return "one completion a pass"
    return f"the micro-batch of {spec.batch_size} rows of up to {spec.max_seq_length:,} tokens"


def levers(spec, world: int = 1, vision=None) -> str:
    """What else would lower the least budget, for the refusal (`world`: the processes a sharded job's
    model is split over; more of them hold less each)."""
    whole = not splits(spec, vision) and spec.method != "grpo" and spec.batch_size > 1
    tips = ["a smaller batch_size"] if whole else []
    tips.append("a shorter max_seq_length" + (" or max_completion_length" if spec.method == "grpo" else ""))
    if not spec.load_in_4bit:
        tips.append("load_in_4bit: true")
    if world > 1:
        tips.append(f"more GPUs than {world} to shard over")
    elif spec.base_precision != "fp8":
        tips.append("sharding: fsdp over several GPUs")
    return ", ".join(tips)
