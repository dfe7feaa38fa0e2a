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
memory: FSDP gathers it with the root (`may_host_table`)."""
from __future__ import annotations

from jobs.models.fit_shape import NF4_BYTES_PER_WEIGHT, _Shape

LORA_PART = "LoRA + AdamW (fp32)"
BASE_PARTS = ("base weights", "base weights (NF4)", "embeddings")   # jobs/models/fit_shape.py _weights
NF4_CODE_BYTES = 0.5   # two 4-bit codes a byte; the rest of NF4_BYTES_PER_WEIGHT is the quant state
VISION_PART, VISION_LORA_PART = "vision tower", "vision LoRA + AdamW (fp32)"   # jobs/models/fit.py


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
