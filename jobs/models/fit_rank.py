"""What one process of a sharded job (`sharding: fsdp`, jobs/train/sharding.py) holds of the static parts:
the arithmetic below both the fit check of a sharded job (fit_shard.py) and the budget plan a sharded
job trains by (fit.py, fit_plan.py), so the plan sizes each rank, not the whole model on one GPU.

Under FSDP2 each GPU keeps 1/N of every weight and of the LoRA weights with their gradients and AdamW
state; on top it holds, while they run, whole copies of what is gathered: a decoder layer's weights
and the next one's (FSDP2 prefetches one layer ahead, in forward and in backward), and the root
group's (embeddings, head, final norm), which FSDP2 keeps gathered from the forward to the backward.
An image-text model's vision tower is in the root group: 1/N of it at rest, and whole from the forward
to the backward. A 4-bit base (FSDP-QLoRA) splits its NF4 codes; each layer's quantization state
(absmax, about 1/32 of the codes) stays whole on every process, and its layers run bitsandbytes' matmul
with PEFT's LoRA on the gathered codes, not the fused NF4 kernels (kernels/lora_patch.py says why), so
they keep a PyTorch layer's activations (`layers_fused`). The input embedding table cannot move to host
memory: FSDP gathers it with the root (`may_host_table`).

One more moment competes with the step's activations (`first_gather`): the first decoder layer's gather.
FSDP2's `wait_for_unshard` frees the previous group's all-gather output only when it returns (its
`prev_all_gather_state` local holds it through the copy-out), and in the forward the group before the
first layer is the root. So while layer 0's gather is copied out each process holds the root's
all-gather output (root-sized: embeddings, head, a vision tower) beside the root's gathered weights,
layer 0's all-gather output and its gathered weights (the "two decoder layers") and the embeddings'
output, before any activation. With every layer recomputed and offloaded that is the peak of the 8B
shape (untied: 1.96 GiB of root): 12.58 GiB measured at 2 ranks, 11.90 predicted without it
(bench/results/fsdp_fit.jsonl, 2026-12-06); the tied 1B's root (0.49 GiB) stays under its activations."""
from __future__ import annotations

from jobs.models.fit_shape import NF4_BYTES_PER_WEIGHT, _Shape

LORA_PART = "LoRA + AdamW (fp32)"
BASE_PARTS = ("base weights", "base weights (NF4)", "embeddings")   # jobs/models/fit_shape.py _weights
NF4_CODE_BYTES = 0.5   # two 4-bit codes a byte; the rest of NF4_BYTES_PER_WEIGHT is the quant state
VISION_PART, VISION_LORA_PART = "vision tower", "vision LoRA + AdamW (fp32)"   # jobs/models/fit.py
FIRST_GATHER_PART = "gathered: the root's all-gather buffer (first layer's gather)"
# the step's activation parts (fit_plan._activations, fit_vision.step_parts): what the first gather competes with
STEP_PARTS = ("activations kept", "step transient", "loss grad (hidden)", "vision activations", "vision step transient")


def per_rank(parts: dict[str, int], spec, shape: _Shape, b: int, world: int) -> dict[str, int]:
    """`parts` (an unsharded job's, static or whole) as each of `world` FSDP processes holds them; the
    activation parts pass through unchanged (they are per process)."""
    if world < 2:
        return dict(parts)
    parts = {k: v for k, v in parts.items() if k not in BASE_PARTS}
    linear = shape.linear_weights()
    per_weight = NF4_CODE_BYTES if spec.load_in_4bit else b
    whole = int(linear * per_weight) + shape.embedding_weights() * b
    parts[f"base weights (1/{world} each)"] = -(-whole // world)
    if spec.load_in_4bit:   # the codes are split; each Linear4bit keeps its whole quant state (absmax)
        parts["NF4 quantization state (whole on each)"] = int(linear * (NF4_BYTES_PER_WEIGHT - NF4_CODE_BYTES))
    parts["gathered: embeddings and head"] = shape.embedding_weights() * b
    parts["gathered: two decoder layers"] = 2 * int(linear // shape.layers * per_weight)
    for part in (LORA_PART, VISION_LORA_PART):
        if part in parts:
            parts[part] = -(-parts[part] // world)
    if VISION_PART in parts:   # gathered with the root for the whole step, beside its shard at rest
        tower = parts.pop(VISION_PART)
        parts["vision tower (gathered with the root)"] = tower + -(-tower // world)
    return parts


def first_gather(parts: dict[str, int], shape: _Shape, b: int, world: int, tokens: int,
                 tower: int = 0) -> dict[str, int]:
    """The part the first decoder layer's gather adds to a sharded step (module doc): what the root's
    all-gather output (embeddings and head, `tower`: a vision tower's weights), the embeddings' output
    and the tower's activations take beyond the step's activation parts in `parts`, when they do."""
    if world < 2:
        return {}
    step = sum(v for k, v in parts.items() if k in STEP_PARTS)
    moment = shape.embedding_weights() * b + tower + tokens * shape.hidden * b + parts.get("vision activations", 0)
    return {FIRST_GATHER_PART: moment - step} if moment > step else {}


def layers_fused(spec, fused: bool, world: int) -> bool:
    """Whether the decoder layers run the fused kernels: not a sharded 4-bit base's (module doc)."""
    return fused and not (world > 1 and spec.load_in_4bit)


def may_host_table(world: int) -> bool:
    """Whether a budget plan may keep the input embedding table in host memory: not when sharded."""
    return world < 2


def notes(spec, world: int) -> list[str]:
    """What the fit check says of a sharded estimate."""
    if world < 2:
        return []
    said = [f"sharded (fsdp) over {world} GPUs: each holds 1/{world} of the weights and LoRA state, plus the "
            "layers being gathered"]
    if spec.load_in_4bit and spec.fused_kernels:
        said.append("the 4-bit layers run bitsandbytes' matmul and PEFT's LoRA on the gathered codes "
                    "(the fused NF4 path needs them whole): a PyTorch layer's activations")
    return said
