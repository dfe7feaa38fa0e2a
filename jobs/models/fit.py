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

from jobs.messages import say
from jobs.models import fit_kto, fit_passes, fit_policy, fit_rank, fit_rollout, fit_vision
from jobs.models.fit_advice import advice, oom_message  # noqa: F401 (re-exported: studio, jobs/train/loop.py)
from jobs.models.fit_estimate import (  # noqa: F401 (re-exported)
    CUDA_CONTEXT_BYTES, FRAGMENTATION, GIB, FitEstimate, _total_gb, allocatable_bytes, least_budget_gb)
from jobs.models.fit_shape import (  # noqa: F401 (re-exported)
    ALL_LINEAR, NF4_BYTES_PER_WEIGHT, ShapeUnknown, _dtype_bytes, _Shape, _targets, _weights, lora_params)
from jobs.models.fit_device import _cuda_memory, current_policy, free_gpu_memory  # noqa: F401 (free_gpu_memory: re-exported)

from jobs.models.fit_plan import (  # noqa: F401 (re-exported: tests, the GRPO and preference passes)
    FLCE_CHUNK_BYTES, LORA_BYTES_PER_PARAM, _activations, _budget_plan, _first_fit, _hostable_table, _inputs_bytes,
    _per_layer, _step_activations)


def plan_within_budget(spec, model_config, trainable: int | None = None, fused: bool | None = None,
                       world: int = 1, **prompts) -> tuple[list[bool], bool, str, int] | None:
    """(recompute flag per decoder layer, offload, description, bytes of the input embedding table
    to host) when the job has a budget and "auto" checkpointing on the fused engine; else None. The
    first three are kernels.apply_checkpointing's `plan`; the last, kernels/host_embedding.py's.
    `world`: the processes a sharded job's model is split over (1: unsharded), each planned alone.
    `prompts`: GRPO's prompt_len and prompts_once, KTO's kto_completions, as the job knows them
    (fit_policy.py, fit_kto.py)."""
    fused = spec.fused_kernels if fused is None else fused
    if not _budgeted(spec, fused):
        return None
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=True)
    vision = fit_vision.VisionShape.of(model_config)
    static = _static_bytes(spec, shape, b, fused, trainable, vision, world)
    whole, (spec, passes) = spec, _policy_pass(spec, model_config, trainable, fused, world, **prompts)
    floor = fit_kto.floor(whole, spec.batch_size, shape, b, prompts.get("kto_completions"))
    recomputed, offload, description, hosted = _budget_plan(spec, shape, b, static, fused, vision=vision,
                                                            world=world, floor=floor)
    description += passes
    # one flag per GradientCheckpointingLayer, as kernels.apply_checkpointing counts them: a vision
    # tower's blocks are such layers too, and come first
    return fit_vision.plan_flags(spec, vision, shape.layers, recomputed), offload, description, hosted


def _static_bytes(spec, shape: _Shape, b: int, fused: bool, trainable: int | None, vision=None,
                  world: int = 1) -> int:
    """Weights, LoRA and its optimizer state: what a process holds before any activation (its share
    of a model sharded over `world` processes, fit_rank.py)."""
    return sum(_static_parts(spec, shape, b, fused, trainable, vision, world).values())


def _static_parts(spec, shape: _Shape, b: int, fused: bool, trainable: int | None, vision,
                  world: int = 1) -> dict[str, int]:
    """`trainable` (counted on the loaded model) holds the tower's LoRA too, when it has any; one
    process's share of them when the model is sharded over `world` (fit_rank.py)."""
    parts = _weights(spec, shape, b, fused)
    adapters = trainable if trainable is not None else lora_params(spec, shape)
    parts["LoRA + AdamW (fp32)"] = adapters * LORA_BYTES_PER_PARAM
    if vision is not None:
        parts["vision tower"] = fit_vision.weight_bytes(spec, vision, b, NF4_BYTES_PER_WEIGHT)
        tower_lora = fit_vision.lora_params(spec, vision) if trainable is None else 0
        if tower_lora:
            parts["vision LoRA + AdamW (fp32)"] = tower_lora * LORA_BYTES_PER_PARAM
    return fit_rank.per_rank(parts, spec, shape, b, world)


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


def _policy(spec, model_config, shape, b, static, free_bytes, total_bytes, fused, layers_now, vision=None,
            world: int = 1, floor: int = 0):
    """(recomputed layers, offload, description, bytes of the input embedding table in host memory);
    the layers counted as _step_activations counts them (`floor`: _budget_plan's)."""
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
        return _budget_plan(spec, shape, b, static, fused, vision=vision, world=world, floor=floor)
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
    if spec.method != "sft":   # a KTO unit is an example and its mismatched KL completion, not a pair
        one, many = (("an example and its KL completion", "examples with their KL completions")
                     if spec.method == "kto" else ("a pair", "pairs"))
        how = f"{many} packed side by side" if packed else f"{one} a row"
        return f"{rows} {spec.batch_size} x {2 * spec.max_seq_length} tokens ({spec.method}: {how})"
    return f"{rows} {spec.batch_size} x {spec.max_seq_length} tokens"


def estimate_peak(spec, model_config, packed: bool | None = None, fused: bool | None = None,
                  trainable: int | None = None, free_bytes: int | None = None,
                  total_bytes: int | None = None, model=None, cuda: bool = True, world: int = 1,
                  **prompts) -> FitEstimate:
    """Predicted peak GPU memory of `spec` on a model of `model_config` (module doc).

    free_bytes / total_bytes: the GPU's free and total memory before loading (sizes "auto"
    checkpointing; default: read from GPU 0 when there is one). model: a loaded (and
    checkpointing-configured) model, whose actual per-layer policy is then used. packed: whether
    rows are packed (the estimate is for full rows either way; recorded in the notes). cuda=False:
    the tensors of a CPU job (fp32 under dtype auto), for a RAM estimate. world: the processes a
    sharded job's model is split over; the estimate is then one process's, planned as it runs (fit_rank.py).
    prompts: GRPO's prompt_len and prompts_once, KTO's kto_completions, as the job knows them
    (fit_policy.py, fit_kto.py).
    """
    fused = spec.fused_kernels if fused is None else fused
    shape, vision = _Shape.of(model_config), fit_vision.VisionShape.of(model_config)
    b = _dtype_bytes(spec, cuda=cuda)
    if not cuda:   # a CPU job's GRPO passes never pack (grpo.py grpo_packing): a prompt per completion
        prompts = {**prompts, "prompts_once": False}
    whole, (spec, passes) = spec, _policy_pass(spec, model_config, trainable, fused, world, **prompts)
    tokens, completions = spec.batch_tokens(), prompts.get("kto_completions")
    floor = fit_kto.floor(whole, spec.batch_size, shape, b, completions)
    parts = _static_parts(spec, shape, b, fused, trainable, vision, world)
    if free_bytes is None and model is None:
        free_bytes, total_bytes = _cuda_memory()
    loaded = current_policy(model, spec, vision) if model is not None else None
    recomputed, offload, policy, hosted = _policy(spec, model_config, shape, b, sum(parts.values()), free_bytes,
                                                  total_bytes, fused, loaded, vision, world, floor)
    if hosted:
        _without_table(parts, hosted)
    notes = [_batch_note(whole, packed) + passes, *fit_rank.notes(whole, world)]
    step = _step_activations(spec, shape, vision, b, fused, recomputed, offload, world)
    if completions:   # KTO's pass with grad holds its completions alone; its other forwards have none
        step = fit_kto.larger_phase(step, whole, spec, shape, b, completions, notes)
    parts.update(_sampling_or_step(whole, model_config, shape, b, step, trainable, notes, world,
                                   prompts.get("prompt_len")) if spec.method == "grpo" else step)
    if hosted:
        notes.append(f"the input embedding table ({hosted / GIB:.2f} GiB) stays in pinned CPU memory: no "
                     "plan fitted the budget with it on the GPU (kernels/host_embedding.py)")
    if not fused:
        notes.append("fused_kernels off: PyTorch keeps more activations and the full logits")
    if spec.max_gpu_memory_gb > 0 and not (fused and spec.gradient_checkpointing == "auto"):
        notes.append(f"max_gpu_memory_gb {spec.max_gpu_memory_gb:g}: the plan follows it only with "
                     "gradient_checkpointing auto on the fused engine")
    stepped = "step transient" in parts   # GRPO's sampling phase has no per-layer plan to redo
    layer_plan = (fit_vision.split_recomputed(spec, vision, recomputed)[1], offload) if stepped else None
    return FitEstimate(parts, policy, tokens, notes, budget_gb=spec.max_gpu_memory_gb, layer_plan=layer_plan)


def rollout_rows(spec, model_config, trainable: int | None = None, prompt_len: int | None = None,
                 allocated: int = 0, world: int = 1) -> tuple[int, int]:
    """(completions one GRPO sampling pass may hold within max_gpu_memory_gb, the GPU bytes each
    holds): every completion of a micro-batch at once without a budget. `prompt_len`: the padded
    prompt width (default max_seq_length); `allocated`: what the job holds now, when more than the
    weights and adapter state (jobs/models/fit_rollout.py)."""
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=True)
    total, G = spec.batch_size * spec.num_generations, spec.num_generations

    def per_row(group: int) -> int:
        return fit_rollout.row_bytes(shape, prompt_len or spec.max_seq_length, spec.max_completion_length, b, group)
    if spec.max_gpu_memory_gb <= 0:   # total is whole groups: each prompt's prefill is shared
        return total, per_row(G)
    free = allocatable_bytes(spec.max_gpu_memory_gb) - max(
        allocated, _static_bytes(spec, shape, b, spec.fused_kernels, trainable, world=world))
    rows = fit_rollout.rows_within(total, free, per_row(G))
    if rows >= G:   # passes of whole groups keep each prompt's prefill shared
        return rows // G * G, per_row(G)
    return fit_rollout.rows_within(total, free, per_row(1)), per_row(1)


def _sampling_or_step(spec, model_config, shape: _Shape, b: int, step: dict, trainable, notes: list,
                      world: int = 1, prompt_len: int | None = None) -> dict:
    """GRPO peaks at the larger of its two phases (fit_rollout.py): that phase's parts, and a note.
    `prompt_len`: the dataset's longest prompt when the job knows it (default max_seq_length)."""
    rows, _ = rollout_rows(spec, model_config, trainable, prompt_len, world=world)
    sampling = fit_rollout.parts(shape, rows, prompt_len or spec.max_seq_length, spec.max_completion_length, b,
                                 fit_rollout.shared_group(rows, spec.num_generations))
    total = spec.batch_size * spec.num_generations
    passes = f"{rows} of its {total} completions a pass" if rows < total else f"all {total} completions in one pass"
    sampled, stepped = sum(sampling.values()) / GIB, sum(step.values()) / GIB
    phase = "sampling" if sampled > stepped else "the policy step"
    notes.append(f"grpo peaks in {phase}: sampling holds {sampled:.2f} GiB beyond the weights ({passes}), "
                 f"the policy step {stepped:.2f} GiB")
    return sampling if sampled > stepped else step


def grpo_policy_rows(spec, model_config, trainable: int | None = None, fused: bool | None = None,
                     world: int = 1, prompt_len: int | None = None, prompts_once: bool | None = None) -> int:
    """Completions one GRPO policy pass (forward + backward) takes: all of a micro-batch's, unless
    max_gpu_memory_gb is set (auto checkpointing, fused engine) and no checkpointing plan fits them;
    then the most for which one does (fewer passes are faster), or all when not even one fits (the
    fit check then reports the overrun). The step's loss is normalised over all its completions
    (jobs/train/loop.py `count`), so the passes' gradients add up to the whole's. A pass holds its
    completions' prompts as fit_policy.py says (`prompt_len`, `prompts_once`: as the job knows them)."""
    from kernels.checkpoint import _host_free_bytes
    rows = spec.batch_size * spec.num_generations
    fused = spec.fused_kernels if fused is None else fused
    if spec.method != "grpo" or not _budgeted(spec, fused):
        return rows
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=True)
    vision = fit_vision.VisionShape.of(model_config)
    static, host = _static_bytes(spec, shape, b, fused, trainable, vision, world), _host_free_bytes()
    once = fit_policy.resolve_once(spec, model_config, prompts_once)
    for passes in range(1, rows + 1):
        part = -(-rows // passes)
        view = fit_policy.policy_view(spec, part, prompt_len, once)
        if _first_fit(view, shape, b, static, fused, host, vision, world) is not None:
            return part
    return rows


def _policy_pass(spec, model_config, trainable, fused, world: int = 1, prompt_len: int | None = None,
                 prompts_once: bool | None = None, kto_completions: tuple[int, ...] | None = None) -> tuple:
    """(the spec as one pass sizes memory, a note when a micro-batch trains in passes: GRPO's policy
    step, or a preference or text SFT micro-batch within a budget, fit_passes.py; KTO's pass with grad
    holds only its completions where the job knows their counts, fit_kto.py)."""
    if fit_passes.splits(spec, fit_vision.VisionShape.of(model_config)):
        part = pass_units(spec, model_config, trainable, fused, world, kto_completions)
        view = dataclasses.replace(spec, batch_size=part) if part < spec.batch_size else spec
        units = f"packed rows or {fit_passes.unit_name(spec, False, 2)}"
        note = (f"; the micro-batch in passes of up to {part} of its {spec.batch_size} units ({units})"
                if part < spec.batch_size else "")
        return (fit_kto.grad_view(view, kto_completions) if kto_completions else view), note
    if spec.method != "grpo":
        return spec, ""
    rows = spec.batch_size * spec.num_generations
    part = grpo_policy_rows(spec, model_config, trainable, fused, world, prompt_len, prompts_once)
    once = fit_policy.resolve_once(spec, model_config, prompts_once)
    view = fit_policy.policy_view(spec, part, prompt_len, once)
    return view, ("; prompts once per group" if once else "") + (
        f"; the policy step in passes of up to {part} of its {rows} completions" if part < rows else "")


def _budgeted(spec, fused: bool) -> bool:
    """Whether the plan follows max_gpu_memory_gb: a budget, auto checkpointing, the fused engine."""
    return spec.max_gpu_memory_gb > 0 and spec.gradient_checkpointing == "auto" and fused


def pass_units(spec, model_config, trainable: int | None = None, fused: bool | None = None,
               world: int = 1, kto_completions: tuple[int, ...] | None = None) -> int:
    """Units (packed rows, pairs or examples) one forward + backward of a preference or text SFT
    micro-batch takes: all batch_size of them, unless a budget plan applies; then the split and plan
    of the least predicted step time among those that fit (fit_passes.py), or 1 when none does (the
    job is then refused: budget_refusal). `kto_completions`: what KTO's passes with grad hold in this
    job's micro-batches (fit_kto.py, pairs.PairPlan.completion_bounds); without them a pass is planned
    for its whole units."""
    fused = spec.fused_kernels if fused is None else fused
    if not (fit_passes.splits(spec, fit_vision.VisionShape.of(model_config)) and _budgeted(spec, fused)):
        return spec.batch_size
    from kernels.checkpoint import _host_free_bytes
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=True)
    static, host = _static_bytes(spec, shape, b, fused, trainable, world=world), _host_free_bytes()

    def fits(view):   # as _budget_plan searches: the embedding table moves to the host only when needed
        floor = fit_kto.floor(spec, view.batch_size, shape, b, kto_completions)
        view = fit_kto.grad_view(view, kto_completions) if kto_completions else view
        found = _first_fit(view, shape, b, static, fused, host, None, world, floor)
        table = _hostable_table(view, shape, b, world)
        if found is None and table and table <= host:
            found = _first_fit(view, shape, b, static - table, fused, host - table, None, world, floor)
        return found
    return fit_passes.choose(spec, shape, fits)[0]


def least_budget(spec, model_config, trainable: int | None = None, fused: bool | None = None,
                 world: int = 1) -> tuple[float, str] | None:
    """(the smallest max_gpu_memory_gb this job can run within, how it would run there) when a budget
    plan applies (else None): its smallest pass (fit_passes.smallest_view) with every layer recomputed,
    their inputs offloaded and the input embedding table in pinned host memory where the host and the
    job allow; GRPO also samples one completion at a time there. KTO's pass is planned for its whole
    units here, as Start and --dry-run know no data (fit_kto.py): a job's own completions may need less."""
    from kernels.checkpoint import _host_free_bytes
    fused = spec.fused_kernels if fused is None else fused
    if not _budgeted(spec, fused):
        return None
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=True)
    vision = fit_vision.VisionShape.of(model_config)
    static, host, view = _static_bytes(spec, shape, b, fused, trainable, vision, world), _host_free_bytes(), \
        fit_passes.smallest_view(spec, vision)
    table = _hostable_table(view, shape, b, world)
    hosted = table if table and table <= host else 0
    n = shape.layers + fit_vision.plannable(view, vision)
    offload = _inputs_bytes(view, shape, vision, b, n) <= host - hosted
    least = static - hosted + sum(_step_activations(view, shape, vision, b, fused, n, offload, world).values())
    if spec.method == "grpo":   # sampling one completion a pass holds its KV cache, prefill and logits
        least = max(least, static + fit_rollout.row_bytes(shape, spec.max_seq_length, spec.max_completion_length, b))
    how = (f"{fit_passes.smallest_pass(spec, vision)}, all {n} layers recomputed"
           + (" with their inputs offloaded to pinned CPU memory" if offload else "")
           + (f", the input embedding table ({hosted / GIB:.2f} GiB) in pinned CPU memory" if hosted else ""))
    return least_budget_gb(least), how


def budget_refusal(spec, model_config, trainable: int | None = None, world: int = 1) -> str | None:
    """Why this job cannot start within its max_gpu_memory_gb, naming the smallest budget that works
    and how the job would run there (jobs/checks/preflight.py: --dry-run and Start; jobs/train/loop.py);
    None when the budget can be met or no budget plan applies."""
    found = least_budget(spec, model_config, trainable, world=world)
    if found is None or found[0] <= spec.max_gpu_memory_gb:
        return None
    return say("budget_below_least", budget=f"{spec.max_gpu_memory_gb:g}", least=f"{found[0]:.2f}", how=found[1],
               levers=fit_passes.levers(spec, world, fit_vision.VisionShape.of(model_config)))
