"""The activation model and the checkpointing plan search of the fit check (jobs/models/fit.py, which
re-exports these): what a step keeps and holds at its peak for a plan, and the fastest plan whose
predicted allocated peak fits `max_gpu_memory_gb` (fit_estimate.allocatable_bytes: the budget bounds
torch's max_memory_allocated, as the bench rows and the peers' peaks are measured)."""
from __future__ import annotations

from jobs.models import fit_rank, fit_vision
from jobs.models.fit_estimate import GIB, allocatable_bytes
from jobs.models.fit_shape import NF4_BYTES_PER_WEIGHT, _Shape

FLCE_CHUNK_BYTES = 256 * 1024 ** 2     # kernels/ops/fused_linear_cross_entropy.py's logits chunk
LORA_BYTES_PER_PARAM = 16              # fp32 parameter, gradient, AdamW exp_avg and exp_avg_sq
def _per_layer(shape: _Shape, tokens: int, b: int, fused: bool) -> int:
    h, q, kv, i = shape.hidden, shape.q, shape.kv, shape.inter
    per_token = 4 * h + 2 * q + 2 * kv + 2 * i if fused else 10 * h + 2 * q + 2 * kv + 6 * i
    return tokens * per_token * b


def _activations(shape: _Shape, tokens: int, b: int, fused: bool, recomputed: int, offload: bool,
                 layers_fused: bool | None = None) -> dict:
    """What the step holds at its peak beyond the static parts. Two moments compete: the loss and the
    backward of the top layers, with every kept activation still alive; and the backward of a
    recomputed layer. The recomputed layers are the first ones (kernels/checkpoint.py's plans), so by
    then the kept layers above have been backpropagated and freed: only the layer inputs remain.
    (Counting both at once over-predicted the 8B budget jobs by ~0.85 GiB: bench/results/job.jsonl,
    2026-12-02.) `layers_fused` False: the decoder layers run PyTorch's path while the loss stays fused
    (a sharded 4-bit base, fit_shard.py)."""
    n, h = shape.layers, shape.hidden
    layer = _per_layer(shape, tokens, b, fused if layers_fused is None else layers_fused)
    layer_input = tokens * h * b
    inputs = 2 * layer_input if offload and recomputed else recomputed * layer_input
    kept_layers = (n - recomputed) * layer
    backward = tokens * (shape.inter + shape.q + 2 * shape.kv) * b
    if fused:
        loss = min(FLCE_CHUNK_BYTES, tokens * shape.vocab * b) + 2 * layer_input
    else:
        loss = tokens * shape.vocab * (b + 4 + 4)
    top = kept_layers + inputs + max(backward, loss)          # loss and the kept layers' backward
    inner = inputs + backward + layer if recomputed else 0    # a recomputed layer's backward
    if top >= inner:
        kept, transient = kept_layers + inputs, max(backward, loss)
    else:
        kept, transient = inputs, backward + layer
    return {"activations kept": kept, "step transient": transient, "loss grad (hidden)": layer_input}


def _step_activations(spec, shape: _Shape, vision, b: int, fused: bool, recomputed: int, offload: bool,
                      world: int = 1) -> dict:
    """The decoder's activation parts and, for an image-text model, its vision tower's (fit_vision.py):
    `recomputed` counts the plannable layers in forward order, a LoRA'd tower's blocks first. `world`:
    the processes sharing the model (a sharded 4-bit base's layers are not fused, and the first layer's
    gather may outweigh the activations: fit_rank.py)."""
    in_tower, in_decoder = fit_vision.split_recomputed(spec, vision, recomputed)
    parts = _activations(shape, spec.batch_tokens(), b, fused, in_decoder, offload,
                         layers_fused=fit_rank.layers_fused(spec, fused, world))
    if vision is not None:
        parts.update(fit_vision.step_parts(spec, vision, b, fused, in_tower, offload, sum(parts.values()),
                                           shape.hidden))
    tower = fit_vision.weight_bytes(spec, vision, b, NF4_BYTES_PER_WEIGHT) if vision is not None else 0
    parts.update(fit_rank.first_gather(parts, shape, b, world, spec.batch_tokens(), tower))
    return parts


def _budget_plan(spec, shape: _Shape, b: int, static: int, fused: bool, host_bytes: int | None = None,
                 vision=None, world: int = 1, floor: int = 0) -> tuple[int, bool, str, int]:
    """The fastest checkpointing plan whose predicted peak fits `max_gpu_memory_gb`: the fewest
    recomputed layers (each costs about 1/n of a forward pass), plain before offloaded at the same
    count (offloading the inputs costs no step time on an H200, bench/NOTES.md, but pins host RAM,
    of which it may use `host_bytes`). When none fits, the frozen input embedding table moves to
    pinned host memory where the job allows it (kernels/host_embedding.py: untied, not GRPO) and the
    plans are tried again without it. The same cost model as the estimate, so the fit check states
    exactly the plan the job runs (jobs/train/loop.py applies it). `static`: what one process holds
    before activations, 1/`world` of a sharded model's (fit_rank.py); `floor`: what the step holds
    beyond it at least, whatever the plan (KTO's forwards without grad, fit_kto.py). Returns
    (recomputed layers, offload, description, bytes of the table hosted)."""
    from kernels.checkpoint import _host_free_bytes
    host = _host_free_bytes() if host_bytes is None else host_bytes
    found, hosted = _first_fit(spec, shape, b, static, fused, host, vision, world, floor), 0
    table = _hostable_table(spec, shape, b, world)
    if found is None and table and table <= host:
        hosted = table
        found = _first_fit(spec, shape, b, static - table, fused, host - table, vision, world, floor)
    if found is None:
        n = shape.layers + fit_vision.plannable(spec, vision)
        offload = _inputs_bytes(spec, shape, vision, b, n) <= host - hosted
        found = n, offload, f"does not fit even with all {n} layers recomputed" + (" and offloaded" if offload else "")
    recomputed, offload, how = found
    if hosted:
        how += f", input embeddings in pinned CPU memory ({hosted / GIB:.2f} GiB)"
    return recomputed, offload, f"auto within the {spec.max_gpu_memory_gb:g} GiB budget: {how}", hosted


def _first_fit(spec, shape: _Shape, b: int, static: int, fused: bool, host: int, vision,
               world: int = 1, floor: int = 0) -> tuple | None:
    """(recomputed, offload, how) of the fastest plan within the budget, or None; `floor`: bytes
    beyond `static` the job holds at another moment of its step, whatever the plan (_budget_plan)."""
    n = shape.layers + fit_vision.plannable(spec, vision)
    for recomputed in range(n + 1):
        for offload in ((False, True) if recomputed else (False,)):
            if offload and _inputs_bytes(spec, shape, vision, b, recomputed) > host:
                continue
            kept = _step_activations(spec, shape, vision, b, fused, recomputed, offload, world)
            if static + max(sum(kept.values()), floor) <= allocatable_bytes(spec.max_gpu_memory_gb):
                how = ("no recompute" if not recomputed else f"{recomputed} of {n} layers recomputed"
                       + (" (vision blocks first)" if n > shape.layers else "")
                       + (", inputs offloaded to pinned CPU memory" if offload else ""))
                return recomputed, offload, how
    return None


def _hostable_table(spec, shape: _Shape, b: int, world: int = 1) -> int:
    """The input embedding table's bytes when a budget may host it (0 when it may not: a table
    tied to the LM head is read whole every step; GRPO generates token by token from it; FSDP
    gathers it with the root of a sharded model)."""
    if shape.tied or spec.method == "grpo" or not fit_rank.may_host_table(world):
        return 0
    return shape.vocab * shape.hidden * b


def _inputs_bytes(spec, shape: _Shape, vision, b: int, recomputed: int) -> int:
    """The recomputed layers' inputs, what offloading pins in host memory."""
    in_tower, in_decoder = fit_vision.split_recomputed(spec, vision, recomputed)
    tower = in_tower * fit_vision.patches(spec, vision) * vision.width if in_tower else 0
    return (in_decoder * spec.batch_tokens() * shape.hidden + tower) * b
