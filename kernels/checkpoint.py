"""Activation checkpointing per decoder layer, with an "auto" policy and CPU offload.

Modes:
- "off": keep every layer's activations (fastest, most memory).
- "on": recompute every decoder layer in backward (`torch.utils.checkpoint`, non-reentrant).
- "offload": recompute every layer, and keep its input not on the GPU but in pinned host memory:
  copied out on a side CUDA stream while the next layers compute, copied back one layer ahead in
  backward (double buffered). The idea is Unsloth's "unsloth" gradient checkpointing
  (`Unsloth_Offloaded_Gradient_Checkpointer`), here with a real side stream, reused pinned buffers
  and prefetch of the next layer's input.
- "auto": estimate each layer's saved activation bytes for `batch_tokens` tokens and spend the free
  memory on NOT recomputing as many layers as fit; checkpoint the rest, offloading them when even
  the checkpointed inputs would not fit.

The hook is transformers' own: every decoder layer is a `GradientCheckpointingLayer`, which calls
`self._gradient_checkpointing_func(partial(forward, **kwargs), hidden_states)` when its
`gradient_checkpointing` flag is set and the model trains (transformers 5.17 and 5.24 alike).
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref

import torch
import torch.utils.checkpoint

from kernels.arch import base_model, decoder_layers, text_config

MODES = ("auto", "on", "off", "offload")
GIB = 1024 ** 3
ESTIMATE_MARGIN = 1.25


# Set while a checkpointed layer re-runs its forward for backward. Backward runs on autograd's
# device threads, and the recompute runs inside it on the same thread: so the flag is per thread.
_RECOMPUTE = threading.local()


def recomputing() -> bool:
    """True inside a checkpointed layer's recompute: the layer's output is thrown away there (its
    next layer's input was kept), so an op whose output feeds only that output may skip its work
    (kernels/lora_patch.py: the MLP's down projection)."""
    return getattr(_RECOMPUTE, "on", False)


@contextlib.contextmanager
def _recompute_scope():
    before, _RECOMPUTE.on = recomputing(), True
    try:
        yield
    finally:
        _RECOMPUTE.on = before


class _HostOffloader:
    """Holds checkpointed layer inputs in (pinned) host memory; on CPU it just keeps a copy."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.host_buffers: dict[int, torch.Tensor] = {}   # layer index -> pinned buffer, reused
        self.pending: list[dict] = []                      # saved inputs of this step, forward order

    def save(self, index: int, hidden: torch.Tensor) -> dict:
        if self.pending and self.pending[-1]["index"] >= index:
            self.pending.clear()  # a new forward began; the last one never ran backward
        saved = {"index": index, "gpu": None, "h2d": None}
        if self.stream is None:
            saved["host"] = hidden.detach().clone()
        else:
            host = self._host_buffer(index, hidden)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                host.copy_(hidden, non_blocking=True)
            hidden.record_stream(self.stream)  # keep the GPU copy alive until the D2H copy ran
            saved["host"] = host
        self.pending.append(saved)
        return saved

    def _host_buffer(self, index: int, like: torch.Tensor) -> torch.Tensor:
        buffer = self.host_buffers.get(index)
        if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
            buffer = torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
            self.host_buffers[index] = buffer
        return buffer

    def _prefetch(self, saved: dict) -> None:
        if saved["gpu"] is not None:
            return
        gpu = torch.empty(saved["host"].shape, dtype=saved["host"].dtype, device=self.device)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            gpu.copy_(saved["host"], non_blocking=True)
            saved["h2d"] = torch.cuda.Event()
            saved["h2d"].record(self.stream)
        saved["gpu"] = gpu

    def load(self, saved: dict) -> torch.Tensor:
        if self.stream is None:
            return saved["host"]
        position = next((i for i, s in enumerate(self.pending) if s is saved), None)
        self._prefetch(saved)
        if position:  # start bringing back the layer that runs backward next
            self._prefetch(self.pending[position - 1])
        if position is not None:
            del self.pending[position]
        torch.cuda.current_stream(self.device).wait_event(saved["h2d"])
        gpu, saved["gpu"] = saved["gpu"], None  # the autograd graph must not keep it past backward
        return gpu


def _rng_state(device: torch.device):
    cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda_state


class _DeviceKeeper:
    """Keeps a checkpointed layer's input where it is, as plain recompute does (torch's checkpoint saves
    its input tensor the same way); the stand-in for `_HostOffloader` where nothing is offloaded."""

    @staticmethod
    def save(index: int, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    @staticmethod
    def load(saved: torch.Tensor) -> torch.Tensor:
        return saved


class _OffloadedCheckpoint(torch.autograd.Function):
    """Run a layer without saving activations; in backward bring its input back and recompute it.

    `anchor` is an empty tensor that requires grad, so backward runs even when the layer's input
    does not require grad (frozen embeddings under LoRA) and the layer's LoRA weights get grads.
    `rows` (kernels/checkpoint_rows.py): recompute and backward over the leading `rows[0]` tokens only,
    with the layer's arguments cut to them (`rows[1]`); the input gradient past them is zero.
    """

    @staticmethod
    def forward(ctx, run_layer, offloader, index, rows, anchor, hidden, *args):
        ctx.run_layer, ctx.offloader, ctx.args, ctx.rows = run_layer, offloader, args, rows
        ctx.rng = _rng_state(hidden.device)
        device_type = hidden.device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type),
                        torch.get_autocast_dtype(device_type))
        ctx.saved = offloader.save(index, hidden)
        with torch.no_grad():
            return run_layer(hidden, *args)

    @staticmethod
    def backward(ctx, *grads):
        full = ctx.offloader.load(ctx.saved)
        run_layer, tokens = ctx.run_layer, None
        if ctx.rows is not None:
            tokens, run_layer = ctx.rows
            grads = tuple(g[:, :tokens] if g is not None else None for g in grads)
        hidden = (full if tokens is None else full[:, :tokens]).detach().requires_grad_(True)
        device_type, autocast_on, autocast_dtype = ctx.autocast
        devices = [hidden.device] if device_type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), _recompute_scope(), \
                torch.autocast(device_type, enabled=autocast_on, dtype=autocast_dtype):
            torch.set_rng_state(ctx.rng[0])
            if ctx.rng[1] is not None:
                torch.cuda.set_rng_state(ctx.rng[1], hidden.device)
            outputs = run_layer(hidden, *ctx.args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if torch.is_tensor(o) and o.requires_grad
                 and g is not None]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grad = hidden.grad
        if tokens is not None:   # the rows past `tokens` had no gradient to give (checkpoint_rows.py)
            grad = torch.cat([grad, grad.new_zeros(full.shape[0], full.shape[1] - tokens, *full.shape[2:])], 1)
        return (None, None, None, None, None, grad) + (None,) * len(ctx.args)


_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> its decoder layers


def checkpointing_layers(model: torch.nn.Module) -> list:
    """`model`'s decoder layers that checkpoint now."""
    listed = _LAYERS.get(model)
    if listed is None:   # walking every module is ~0.5 ms of host time on the 1B shape: once per model
        listed = _LAYERS[model] = decoder_layers(model)
    return [layer for layer in listed if getattr(layer, "gradient_checkpointing", False)]


@contextlib.contextmanager
def checkpointing_paused(model: torch.nn.Module):
    """No decoder layer checkpoints inside: for a forward without grad in training mode (KTO's KL
    completions), where recomputing is moot and an offloaded layer would copy its input to the host
    for a backward that never runs."""
    layers = checkpointing_layers(model)
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True


def _recompute_contexts():
    return contextlib.nullcontext(), _recompute_scope()


def _plain_checkpoint(run_layer, *args):
    return torch.utils.checkpoint.checkpoint(run_layer, *args, use_reentrant=False, context_fn=_recompute_contexts)


def _offload_checkpoint(offloader, index, run_layer, hidden, *args):
    return kept_input_checkpoint(offloader, index, None, run_layer, hidden, *args)


def kept_input_checkpoint(keeper, index: int, rows, run_layer, hidden, *args):
    """`_OffloadedCheckpoint` with its input kept by `keeper` (an offloader, or `_DeviceKeeper`) and
    `rows` (None: recompute every token; kernels/checkpoint_rows.py)."""
    anchor = torch.empty(0, device=hidden.device, requires_grad=True)
    return _OffloadedCheckpoint.apply(run_layer, keeper, index, rows, anchor, hidden, *args)


def input_keeper(policy, index: int) -> tuple:
    """(keeper, index): where a layer's checkpoint `policy` keeps its input, its offloader or the device."""
    if isinstance(policy, functools.partial) and policy.func is _offload_checkpoint:
        return policy.args[0], policy.args[1]
    return _DeviceKeeper, index


def frozen_lead(model: torch.nn.Module, layers: list) -> int:
    """How many checkpointing layers at the front hold no trainable parameter while every trainable
    parameter of the model lives in a later layer: a frozen vision tower's blocks under a LoRA'd
    decoder. Nothing before them is trained and their inputs need no gradient, so they keep no
    activations for backward; checkpointing them only costs (an offloaded input's copies)."""
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    lead = 0
    while lead < len(layers) and not any(id(p) in trainable for p in layers[lead].parameters()):
        lead += 1
    later = {id(p) for layer in layers[lead:] for p in layer.parameters()}
    return lead if trainable and lead < len(layers) and trainable <= later else 0


def _set_policy(layers, recompute: list[bool], offload: bool, device: torch.device) -> None:
    offloader = _HostOffloader(device) if offload else None
    for index, (layer, on) in enumerate(zip(layers, recompute)):
        layer.gradient_checkpointing = on
        if not on:
            continue
        if offloader is None:
            layer._gradient_checkpointing_func = _plain_checkpoint
        else:
            layer._gradient_checkpointing_func = functools.partial(_offload_checkpoint, offloader, index)


def layer_activation_bytes(model_config, batch_tokens: int, dtype_bytes: int, batch_size: int = 1) -> int:
    """Bytes one decoder layer keeps for backward when it is not checkpointed (LoRA, frozen base).

    Per token it keeps: the residual input and both norm inputs/outputs (~4 h), q, k, v and the
    attention output and o_proj input (~2 h + 2 kv), gate, up and the activation output (3 I); an
    eager attention also keeps its [heads, seq, seq] probabilities (SDPA / flash keep only
    a log-sum-exp row). LoRA's own intermediates are r-wide and negligible.
    """
    config = text_config(model_config)
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", heads) * head_dim
    per_token = 6 * hidden + 2 * kv + 3 * config.intermediate_size
    total = batch_tokens * per_token * dtype_bytes
    if getattr(config, "_attn_implementation", None) == "eager":
        seq = max(batch_tokens // max(batch_size, 1), 1)
        total += 2 * batch_size * heads * seq * seq * dtype_bytes
    return total


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # keep room for logits / loss chunks, the optimizer step and allocator fragmentation
        return max(free - int(0.10 * total) - 2 * GIB, 0)
    return _host_free_bytes()


def _host_free_bytes() -> int:
    """Host RAM that checkpointed inputs may pin (half of what is available)."""
    import psutil

    return int(psutil.virtual_memory().available * 0.5)


def _clamp(keep: int, n: int) -> int:
    """At least 0 layers kept, at most n - 1 (otherwise "no recompute" would have fit)."""
    return int(min(max(keep, 0), n - 1))


def plan_auto(n: int, model_config, dtype_bytes: int, batch_tokens: int, budget: int,
              device_type: str, host_bytes: int | None = None) -> tuple[list[bool], bool, str]:
    """(recompute flag per layer, offload, description) for mode "auto".

    With `keep` layers not checkpointed the peak is about keep * per_layer (their activations)
    + (n - keep) * input (the checkpointed layers' inputs, unless offloaded) + per_layer (one
    layer being recomputed); pick the largest `keep` that fits the budget. Offload (CUDA only)
    when even checkpointing every layer would not fit, or, given `host_bytes` of pinnable host
    RAM, whenever moving the checkpointed inputs to the host lets more layers skip recompute:
    on an H200 the offload costs no step time (bench/NOTES.md: Llama-3.1-8B 358.9 vs 359.5 ms,
    Llama-3.2-1B 135.5 vs 136.0 ms), while every layer that skips recompute saves ~1/32 of a
    forward pass.
    """
    # 25 % over the estimate: unfused PEFT keeps fp32 copies of LoRA inputs, plus fragmentation
    per_layer = max(int(ESTIMATE_MARGIN * layer_activation_bytes(model_config, batch_tokens, dtype_bytes)), 1)
    input_bytes = batch_tokens * text_config(model_config).hidden_size * dtype_bytes
    sizes = f"{per_layer / GIB:.2f} GiB/layer for {batch_tokens} tokens, {budget / GIB:.1f} GiB to spend"
    if n * per_layer <= budget:
        return [False] * n, False, f"auto: no recompute ({n} layers x {sizes})"
    keep_on_gpu = _clamp((budget - n * input_bytes - per_layer) // max(per_layer - input_bytes, 1), n)
    keep_offloaded = _clamp((budget - per_layer) // per_layer, n)
    must_offload = n * input_bytes + per_layer > budget
    worth_offloading = (host_bytes is not None and keep_offloaded > keep_on_gpu
                        and (n - keep_offloaded) * input_bytes <= host_bytes)
    offload = device_type == "cuda" and (must_offload or worth_offloading)
    keep = keep_offloaded if offload else keep_on_gpu
    how = "offloaded to pinned CPU memory" if offload else "recomputed"
    flags = [True] * (n - keep) + [False] * keep
    return flags, offload, f"auto: {n - keep} of {n} layers {how} ({sizes})"


FIXED_POLICIES = {
    "off": "checkpointing off: {n} layers keep their activations",
    "on": "checkpointing on: {n} layers recomputed in backward",
    "offload": "checkpointing offload: {n} layers recomputed, inputs in pinned CPU memory",
}


def _default_batch_tokens(model) -> int:
    config = text_config(base_model(model).config)
    return min(getattr(config, "max_position_embeddings", 2048), 4096)


def enable_recompute(model) -> None:
    """transformers' own checkpointing on every decoder layer (the PyTorch path's), non-reentrant.
    transformers 5.2x renamed `gradient_checkpointing_enable` (an alias that warns until v6); older 5.x
    has only the old name."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def apply_checkpointing(model: torch.nn.Module, mode: str = "auto", report=None,
                        batch_tokens: int | None = None,
                        plan: tuple[list[bool], bool, str] | None = None) -> str:
    """Set the activation-checkpointing policy of `model`'s decoder layers; return a one-line
    description of the policy. `batch_tokens` (micro-batch size x sequence length) drives "auto"
    (default: one sequence of min(max_position_embeddings, 4096)). `plan` replaces "auto"'s own
    choice by one made elsewhere: (recompute flag per layer, offload, description), e.g. the
    fastest plan within a memory budget (jobs/models/fit.py `plan_within_budget`); offload falls back to
    plain recompute off CUDA. `report` (a PatchReport) gets the description as a note, and any
    fallback with its reason.

    Call it after anything that runs `gradient_checkpointing_enable()` (e.g. PEFT's
    `prepare_model_for_kbit_training`), which would otherwise overwrite the per-layer policy.
    """
    if mode not in MODES:
        raise ValueError(f"apply_checkpointing: mode must be one of {MODES}, got {mode!r}")
    layers = decoder_layers(model)
    if not layers:
        description = "checkpointing off: no transformers decoder layers (GradientCheckpointingLayer) found"
        if report is not None and mode != "off":
            report.fallback("checkpointing", 0, description)
        return description
    device, n, suffix = next(model.parameters()).device, len(layers), ""
    lead = frozen_lead(model, layers)
    if mode == "offload" and device.type != "cuda":
        reason = f"offload needs CUDA (pinned memory and a side stream); model is on {device.type}"
        if report is not None:
            report.fallback("checkpoint_offload", n, reason + "; using plain checkpointing")
        mode, suffix = "on", f" (offload fell back: {reason})"
    if mode == "auto" and plan is not None:
        flags, offload, description = list(plan[0]), plan[1] and device.type == "cuda", plan[2]
        if len(flags) != n:
            raise ValueError(f"apply_checkpointing: the plan has {len(flags)} layer flags, the model {n} layers")
    elif mode == "auto":
        flags, offload, description = plan_auto(
            n, base_model(model).config, next(model.parameters()).element_size(),
            batch_tokens or _default_batch_tokens(model), _free_bytes(device), device.type,
            _host_free_bytes() if device.type == "cuda" else None)
    else:
        flags, offload = [mode != "off"] * n, mode == "offload"
        description = FIXED_POLICIES[mode].format(n=n - (lead if mode != "off" else 0))
    if any(flags[:lead]):   # a frozen vision tower's blocks: recomputing or offloading them buys nothing
        flags = [False] * lead + flags[lead:]
        description += f" ({lead} frozen leading layers, e.g. a frozen vision tower's blocks, keep nothing and are left alone)"
    _set_policy(layers, flags, offload, device)
    description += suffix
    if report is not None:
        report.note(description)
    return description
