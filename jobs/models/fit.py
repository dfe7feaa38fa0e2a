"""Will this job fit on the GPU? A prediction of its peak GPU memory from the config alone.

    from jobs.models.fit import estimate_peak, free_gpu_memory
    est = estimate_peak(spec, AutoConfig.from_pretrained(source))
    est.total_gb, est.allocated_gb, est.breakdown()      # GiB (2**30 bytes), like torch and NVML
    free_gpu_memory(0)                                   # GiB free on NVML device 0, or None

`allocated_gb` predicts `torch.cuda.max_memory_allocated()`; `total_gb` adds the CUDA context and
allocator slack, i.e. what the job takes out of the card's free memory. The model (bytes):

- weights: every base parameter in the training dtype; QLoRA stores the decoder's linear weights
  as NF4 (0.5 B + one uint8 absmax per 64 values, double quantised), embeddings and lm_head stay
  in the dtype, and the fused engine adds one dequantisation buffer per linear shape
  (docs/kernels.md); fp8 base weights take 1 B per linear weight;
- LoRA: r (in + out) per adapted projection, fp32 as PEFT makes them: parameter, gradient and two
  AdamW moments, 16 B each;
- activations for T = JobSpec.batch_tokens() tokens (sft: batch_size x max_seq_length; a pair of a
  preference method is one row of 2 x max_seq_length; grpo: batch_size x num_generations rows of
  prompt + completion; packed rows are exactly that, padded batches at most that). A decoder layer that is not recomputed keeps, per token, with the fused
  engine 4h + 2 q + 2 kv + 2 I values (residual input, two norm outputs and the residual sum; q
  and the attention output; k and v; gate and up: docs/kernels.md "Fused LoRA"); unfused PEFT
  also keeps act(gate), the down input and fp32 copies of every LoRA input, about 10h + 2 q +
  2 kv + 6 I. A recomputed layer keeps only its input (T h), or nothing on the GPU when offloaded
  (two prefetch buffers instead). The checkpointing plan is the one kernels/checkpoint.py will
  pick (`plan_auto` with the same free-memory budget) or, after loading, the one the model has;
- the peak during the step, the larger of two moments: the kept activations with the larger of the
  loss phase (fused: one 256 MiB logits chunk and the final hidden states; unfused: the N x V logits
  in the dtype, their fp32 copy and fp32 gradient) and one layer's backward (d(h) of width I and the
  attention gradients); or a recomputed layer's backward (its activations again and that backward),
  when only the layer inputs are still kept (the kept layers, the last ones, are backpropagated
  first); plus the loss's gradient w.r.t. the hidden states.

GRPO peaks at the larger of the policy step and sampling, where each completion holds its KV cache
(jobs/models/fit_rollout.py); `rollout_rows` is how many completions a sampling pass may take.

Image-text models (Qwen2-VL, Qwen2.5-VL) add their vision tower: its weights, its LoRA when it has
any, the image patches and the activations of the most patches a micro-batch can hold, and a LoRA'd
tower's blocks join the layers a plan may recompute (jobs/models/fit_vision.py, with its formulas).

Checked against the measured peaks of bench/results/lora.jsonl (tests/jobs/models/test_fit.py): Llama-3.2-1B
bs4x2048 on/offload, Llama-3.1-8B bs2x2048 on/offload/no recompute and QLoRA offload: within 3 %.
"""
from __future__ import annotations

import dataclasses

from jobs.models import fit_rollout, fit_vision
from jobs.models.fit_advice import advice, oom_message  # noqa: F401 (re-exported: studio, jobs/train/loop.py)
from jobs.models.fit_estimate import (  # noqa: F401 (re-exported)
    CUDA_CONTEXT_BYTES, FRAGMENTATION, GIB, FitEstimate, _total_gb, allocatable_bytes)
from jobs.models.fit_shape import (  # noqa: F401 (re-exported)
    ALL_LINEAR, NF4_BYTES_PER_WEIGHT, _dtype_bytes, _Shape, _targets, _weights, lora_params)
from jobs.models.fit_device import _cuda_memory, current_policy, free_gpu_memory  # noqa: F401 (free_gpu_memory: re-exported)

FLCE_CHUNK_BYTES = 256 * 1024 ** 2     # kernels/ops/fused_linear_cross_entropy.py's logits chunk
LORA_BYTES_PER_PARAM = 16              # fp32 parameter, gradient, AdamW exp_avg and exp_avg_sq
def _per_layer(shape: _Shape, tokens: int, b: int, fused: bool) -> int:
    h, q, kv, i = shape.hidden, shape.q, shape.kv, shape.inter
    per_token = 4 * h + 2 * q + 2 * kv + 2 * i if fused else 10 * h + 2 * q + 2 * kv + 6 * i
    return tokens * per_token * b


def _activations(shape: _Shape, tokens: int, b: int, fused: bool, recomputed: int, offload: bool) -> dict:
    """What the step holds at its peak beyond the static parts. Two moments compete: the loss and the
    backward of the top layers, with every kept activation still alive; and the backward of a
    recomputed layer. The recomputed layers are the first ones (kernels/checkpoint.py's plans), so by
    then the kept layers above have been backpropagated and freed: only the layer inputs remain.
    (Counting both at once over-predicted the 8B budget jobs by ~0.85 GiB: bench/results/job.jsonl,
    2026-12-02.)"""
    n, h = shape.layers, shape.hidden
    layer = _per_layer(shape, tokens, b, fused)
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


def _step_activations(spec, shape: _Shape, vision, b: int, fused: bool, recomputed: int, offload: bool) -> dict:
    """The decoder's activation parts and, for an image-text model, its vision tower's (fit_vision.py):
    `recomputed` counts the plannable layers in forward order, a LoRA'd tower's blocks first."""
    in_tower, in_decoder = fit_vision.split_recomputed(spec, vision, recomputed)
    parts = _activations(shape, spec.batch_tokens(), b, fused, in_decoder, offload)
    if vision is not None:
        parts.update(fit_vision.step_parts(spec, vision, b, fused, in_tower, offload, sum(parts.values()),
                                           shape.hidden))
    return parts


def _budget_plan(spec, shape: _Shape, b: int, static: int, fused: bool,
                 host_bytes: int | None = None, vision=None) -> tuple[int, bool, str, int]:
    """The fastest checkpointing plan whose predicted peak fits `max_gpu_memory_gb`: the fewest
    recomputed layers (each costs about 1/n of a forward pass), plain before offloaded at the same
    count (offloading the inputs costs no step time on an H200, bench/NOTES.md, but pins host RAM,
    of which it may use `host_bytes`). When none fits, the frozen input embedding table moves to
    pinned host memory where the job allows it (kernels/host_embedding.py: untied, not GRPO) and the
    plans are tried again without it. The same cost model as the estimate, so the fit check states
    exactly the plan the job runs (jobs/train/loop.py applies it). Returns (recomputed layers,
    offload, description, bytes of the table hosted)."""
    from kernels.checkpoint import _host_free_bytes
    host = _host_free_bytes() if host_bytes is None else host_bytes
    found, hosted = _first_fit(spec, shape, b, static, fused, host, vision), 0
    table = _hostable_table(spec, shape, b)
    if found is None and table and table <= host:
        hosted = table
        found = _first_fit(spec, shape, b, static - table, fused, host - table, vision)
    if found is None:
        n = shape.layers + fit_vision.plannable(spec, vision)
        offload = _inputs_bytes(spec, shape, vision, b, n) <= host - hosted
        found = n, offload, f"does not fit even with all {n} layers recomputed" + (" and offloaded" if offload else "")
    recomputed, offload, how = found
    if hosted:
        how += f", input embeddings in pinned CPU memory ({hosted / GIB:.2f} GiB)"
    return recomputed, offload, f"auto within the {spec.max_gpu_memory_gb:g} GiB budget: {how}", hosted


def _first_fit(spec, shape: _Shape, b: int, static: int, fused: bool, host: int, vision) -> tuple | None:
    """(recomputed, offload, how) of the fastest plan within the budget, or None."""
    n = shape.layers + fit_vision.plannable(spec, vision)
    for recomputed in range(n + 1):
        for offload in ((False, True) if recomputed else (False,)):
            if offload and _inputs_bytes(spec, shape, vision, b, recomputed) > host:
                continue
            kept = _step_activations(spec, shape, vision, b, fused, recomputed, offload)
            if _total_gb(static + sum(kept.values())) <= spec.max_gpu_memory_gb:
                how = ("no recompute" if not recomputed else f"{recomputed} of {n} layers recomputed"
                       + (" (vision blocks first)" if n > shape.layers else "")
                       + (", inputs offloaded to pinned CPU memory" if offload else ""))
                return recomputed, offload, how
    return None


def _hostable_table(spec, shape: _Shape, b: int) -> int:
    """The input embedding table's bytes when a budget may host it (0 when it may not: a table
    tied to the LM head is read whole every step; GRPO generates token by token from it)."""
    return 0 if shape.tied or spec.method == "grpo" else shape.vocab * shape.hidden * b


def _inputs_bytes(spec, shape: _Shape, vision, b: int, recomputed: int) -> int:
    """The recomputed layers' inputs, what offloading pins in host memory."""
    in_tower, in_decoder = fit_vision.split_recomputed(spec, vision, recomputed)
    tower = in_tower * fit_vision.patches(spec, vision) * vision.width if in_tower else 0
    return (in_decoder * spec.batch_tokens() * shape.hidden + tower) * b


def plan_within_budget(spec, model_config, trainable: int | None = None,
                       fused: bool | None = None) -> tuple[list[bool], bool, str, int] | None:
    """(recompute flag per decoder layer, offload, description, bytes of the input embedding table
    to host) when the job has a budget and "auto" checkpointing on the fused engine; else None. The
    first three are kernels.apply_checkpointing's `plan`; the last, kernels/host_embedding.py's."""
    fused = spec.fused_kernels if fused is None else fused
    if not (spec.max_gpu_memory_gb > 0 and spec.gradient_checkpointing == "auto" and fused):
        return None
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=True)
    vision = fit_vision.VisionShape.of(model_config)
    static = _static_bytes(spec, shape, b, fused, trainable, vision)
    spec, passes = _policy_pass(spec, model_config, trainable, fused)
    recomputed, offload, description, hosted = _budget_plan(spec, shape, b, static, fused, vision=vision)
    description += passes
    # one flag per GradientCheckpointingLayer, as kernels.apply_checkpointing counts them: a vision
    # tower's blocks are such layers too, and come first
    return fit_vision.plan_flags(spec, vision, shape.layers, recomputed), offload, description, hosted


def _static_bytes(spec, shape: _Shape, b: int, fused: bool, trainable: int | None, vision=None) -> int:
    """Weights, LoRA and its optimizer state: what the job holds before any activation."""
    return sum(_static_parts(spec, shape, b, fused, trainable, vision).values())


def _static_parts(spec, shape: _Shape, b: int, fused: bool, trainable: int | None, vision) -> dict[str, int]:
    """`trainable` (counted on the loaded model) holds the tower's LoRA too, when it has any."""
    parts = _weights(spec, shape, b, fused)
    adapters = trainable if trainable is not None else lora_params(spec, shape)
    parts["LoRA + AdamW (fp32)"] = adapters * LORA_BYTES_PER_PARAM
    if vision is not None:
        parts["vision tower"] = fit_vision.weight_bytes(spec, vision, b, NF4_BYTES_PER_WEIGHT)
        tower_lora = fit_vision.lora_params(spec, vision) if trainable is None else 0
        if tower_lora:
            parts["vision LoRA + AdamW (fp32)"] = tower_lora * LORA_BYTES_PER_PARAM
    return parts


def _auto_plan(spec, model_config, shape: _Shape, b: int, static: int, free_bytes: int | None,
               total_bytes: int | None, vision=None) -> tuple[int, bool, str]:
    """What kernels/checkpoint.py's "auto" will choose, from the free memory before loading (it plans
    over every GradientCheckpointingLayer: a vision tower's blocks, then the decoder's layers)."""
    from kernels.checkpoint import GIB as CK_GIB, _host_free_bytes, plan_auto
    if free_bytes is None:
        every = shape.layers + fit_vision.plannable(spec, vision)
        return every, False, "auto (no GPU to size it: assumed every layer recomputed)"
    budget = max(free_bytes - static - int(0.10 * (total_bytes or free_bytes)) - 2 * CK_GIB, 0)
    tokens = spec.batch_tokens()
    flags, offload, description = plan_auto(shape.layers + (vision.depth if vision else 0), model_config, b,
                                            tokens, budget, "cuda", _host_free_bytes())
    return fit_vision.recomputed_of_flags(spec, vision, flags), offload, description


def _policy(spec, model_config, shape, b, static, free_bytes, total_bytes, fused, layers_now, vision=None):
    """(recomputed layers, offload, description, bytes of the input embedding table in host memory);
    the layers counted as _step_activations counts them."""
    if layers_now is not None:
        return layers_now
    mode = spec.gradient_checkpointing
    if not fused and mode in ("auto", "offload"):
        mode = "on"   # the PyTorch path recomputes every layer for auto/offload (jobs/train/loop.py)
    if mode == "off":
        return 0, False, "off", 0
    if mode in ("on", "offload"):
        return shape.layers + fit_vision.plannable(spec, vision), mode == "offload", mode, 0
    if spec.max_gpu_memory_gb > 0 and fused:
        return _budget_plan(spec, shape, b, static, fused, vision=vision)
    return (*_auto_plan(spec, model_config, shape, b, static, free_bytes, total_bytes, vision), 0)


def _without_table(parts: dict[str, int], hosted: int) -> None:
    """The weights part less the input embedding table kept in host memory."""
    key = "embeddings" if "embeddings" in parts else "base weights"
    parts[key] -= hosted


def _batch_note(spec, packed: bool | None) -> str:
    rows = "packed rows" if packed else "padded rows, at most"
    if spec.method == "grpo":
        return (f"{rows} {spec.batch_size} prompts x {spec.num_generations} completions of up to "
                f"{spec.max_seq_length} + {spec.max_completion_length} tokens")
    if spec.method != "sft":
        return f"{rows} {spec.batch_size} x {2 * spec.max_seq_length} tokens ({spec.method}: a pair a row)"
    return f"{rows} {spec.batch_size} x {spec.max_seq_length} tokens"


def estimate_peak(spec, model_config, packed: bool | None = None, fused: bool | None = None,
                  trainable: int | None = None, free_bytes: int | None = None,
                  total_bytes: int | None = None, model=None, cuda: bool = True) -> FitEstimate:
    """Predicted peak GPU memory of `spec` on a model of `model_config` (module doc).

    free_bytes / total_bytes: the GPU's free and total memory before loading (sizes "auto"
    checkpointing; default: read from GPU 0 when there is one). model: a loaded (and
    checkpointing-configured) model, whose actual per-layer policy is then used. packed: whether
    rows are packed (the estimate is for full rows either way; recorded in the notes). cuda=False:
    the tensors of a CPU job (fp32 under dtype auto), for a RAM estimate.
    """
    fused = spec.fused_kernels if fused is None else fused
    shape, vision = _Shape.of(model_config), fit_vision.VisionShape.of(model_config)
    b = _dtype_bytes(spec, cuda=cuda)
    whole, (spec, passes) = spec, _policy_pass(spec, model_config, trainable, fused)
    tokens = spec.batch_tokens()
    parts = _static_parts(spec, shape, b, fused, trainable, vision)
    if free_bytes is None and model is None:
        free_bytes, total_bytes = _cuda_memory()
    loaded = current_policy(model, spec, vision) if model is not None else None
    recomputed, offload, policy, hosted = _policy(spec, model_config, shape, b, sum(parts.values()), free_bytes,
                                                  total_bytes, fused, loaded, vision)
    if hosted:
        _without_table(parts, hosted)
    notes = [_batch_note(whole, packed) + passes]
    step = _step_activations(spec, shape, vision, b, fused, recomputed, offload)
    parts.update(_sampling_or_step(whole, model_config, shape, b, step, trainable, notes)
                 if spec.method == "grpo" else step)
    if hosted:
        notes.append(f"the input embedding table ({hosted / GIB:.2f} GiB) stays in pinned CPU memory: no "
                     "plan fitted the budget with it on the GPU (kernels/host_embedding.py)")
    if not fused:
        notes.append("fused_kernels off: PyTorch keeps more activations and the full logits")
    if spec.max_gpu_memory_gb > 0 and not (fused and spec.gradient_checkpointing == "auto"):
        notes.append(f"max_gpu_memory_gb {spec.max_gpu_memory_gb:g}: the plan follows it only with "
                     "gradient_checkpointing auto on the fused engine")
    return FitEstimate(parts, policy, tokens, notes, budget_gb=spec.max_gpu_memory_gb)


def rollout_rows(spec, model_config, trainable: int | None = None, prompt_len: int | None = None,
                 allocated: int = 0) -> tuple[int, int]:
    """(completions one GRPO sampling pass may hold within max_gpu_memory_gb, the GPU bytes each
    holds): every completion of a micro-batch at once without a budget. `prompt_len`: the padded
    prompt width (default max_seq_length); `allocated`: what the job holds now, when more than the
    weights and adapter state (jobs/models/fit_rollout.py)."""
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=True)
    rows = spec.batch_size * spec.num_generations
    per_row = fit_rollout.row_bytes(shape, prompt_len or spec.max_seq_length, spec.max_completion_length, b)
    if spec.max_gpu_memory_gb <= 0:
        return rows, per_row
    held = max(allocated, _static_bytes(spec, shape, b, spec.fused_kernels, trainable))
    return fit_rollout.rows_within(rows, allocatable_bytes(spec.max_gpu_memory_gb) - held, per_row), per_row


def _sampling_or_step(spec, model_config, shape: _Shape, b: int, step: dict, trainable, notes: list) -> dict:
    """GRPO peaks at the larger of its two phases (fit_rollout.py): that phase's parts, and a note."""
    rows, _ = rollout_rows(spec, model_config, trainable)
    sampling = fit_rollout.parts(shape, rows, spec.max_seq_length, spec.max_completion_length, b)
    total = spec.batch_size * spec.num_generations
    passes = f"{rows} of its {total} completions a pass" if rows < total else f"all {total} completions in one pass"
    sampled, stepped = sum(sampling.values()) / GIB, sum(step.values()) / GIB
    phase = "sampling" if sampled > stepped else "the policy step"
    notes.append(f"grpo peaks in {phase}: sampling holds {sampled:.2f} GiB beyond the weights ({passes}), "
                 f"the policy step {stepped:.2f} GiB")
    return sampling if sampled > stepped else step


def grpo_policy_rows(spec, model_config, trainable: int | None = None, fused: bool | None = None) -> int:
    """Completions one GRPO policy pass (forward + backward) takes: all of a micro-batch's, unless
    max_gpu_memory_gb is set (auto checkpointing, fused engine) and no checkpointing plan fits them;
    then the most for which one does (fewer passes are faster), or all when not even one fits (the
    fit check then reports the overrun). The step's loss is normalised over all its completions
    (jobs/train/loop.py `count`), so the passes' gradients add up to the whole's."""
    from kernels.checkpoint import _host_free_bytes
    rows = spec.batch_size * spec.num_generations
    fused = spec.fused_kernels if fused is None else fused
    if spec.method != "grpo" or not (spec.max_gpu_memory_gb > 0 and spec.gradient_checkpointing == "auto" and fused):
        return rows
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=True)
    vision = fit_vision.VisionShape.of(model_config)
    static, host = _static_bytes(spec, shape, b, fused, trainable, vision), _host_free_bytes()
    for passes in range(1, rows + 1):
        part = -(-rows // passes)
        view = dataclasses.replace(spec, batch_size=1, num_generations=part)
        if _first_fit(view, shape, b, static, fused, host, vision) is not None:
            return part
    return rows


def _policy_pass(spec, model_config, trainable, fused) -> tuple:
    """(the spec as one policy pass sizes memory, a note when a GRPO micro-batch trains in passes)."""
    rows = spec.batch_size * spec.num_generations if spec.method == "grpo" else 0
    part = grpo_policy_rows(spec, model_config, trainable, fused) if rows else 0
    if part >= rows:
        return spec, ""
    return (dataclasses.replace(spec, batch_size=1, num_generations=part),
            f"; the policy step in passes of up to {part} of its {rows} completions")
