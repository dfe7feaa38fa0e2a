"""Route PEFT LoRA layers of a transformers model through the fused LoRA ops (instances only).

What `patch_lora_layers(model, report, use_triton)` does, per module INSTANCE:

* every fusable PEFT LoRA `Linear` (plain or bitsandbytes NF4 base): its `forward` is rebound to
  `kernels.ops.lora_o.lora_o` (one-projection fused autograd). Reported as `lora_o` (o_proj) or
  `lora_linear` (others) only when it is not part of a fused QKV/MLP group below; q/k/v of a fused
  group are still patched alone, for attention forwards that do not use the seam.
* every MLP with gate_proj/up_proj/down_proj and a silu or gelu-tanh `act_fn`, whose projections
  are fusable (LoRA or plain frozen Linear / Linear4bit, at least one LoRA): `mlp.forward` is
  rebound to `kernels.ops.lora_mlp.lora_mlp`. Reported as `lora_mlp`.
* every attention module with q_proj/k_proj/v_proj, all fusable, at least one LoRA: gets the
  attribute (the seam with kernels/patch.py's attention forward):

      attn._fusetune_qkv(hidden_states: Tensor[..., hidden]) -> (q, k, v)
          q, k, v exactly as attn.q_proj(hidden_states), attn.k_proj(...), attn.v_proj(...)
          (shape [..., n_heads * head_dim] etc., before any view/transpose/norm/rope)
      attn._fusetune_o(attn_output: Tensor[..., n_heads * head_dim]) -> Tensor[..., hidden]
          exactly attn.o_proj(attn_output) (o_proj's own forward is already fused; this is a
          convenience alias so the attention forward can call one name)

  An attention forward that calls `_fusetune_qkv` when present gets the three-projection fusion
  (`lora_qkv`); one that calls q_proj/k_proj/v_proj still gets the per-projection fusion.

Every fused forward re-checks cheap runtime conditions each call (not merged, the same single
active adapter, Triton can run on the input, dtypes agree, no extra PEFT kwargs such as
`adapter_names`) and otherwise calls the module's original forward, so merging and generation keep
working; under `with model.disable_adapter():` the same fused kernels run over the base weights
alone (a reference policy's forward). What cannot be fused is left alone
and reported with the reason (dropout > 0, DoRA, bias on the LoRA B, fan_in_fan_out, several
active adapters, 8-bit or fp4 base weights, fused qkv_proj / gate_up_proj as in Phi-3, ...).
NF4 layers compute in their quant_state dtype (input cast to it, output cast back, as bitsandbytes).
"""
from __future__ import annotations

from collections import Counter

import torch

from kernels.arch import base_model, find_arch
from kernels.checkpoint import recomputing
from kernels.ops._launch import triton_runs_on
from kernels.ops._lora_common import LoraProjection, as_dtype
from kernels.ops.fp8_linear import Fp8Linear
from kernels.ops.lora_mlp import lora_mlp
from kernels.ops.lora_o import lora_o
from kernels.ops.lora_qkv import lora_qkv

# a checkpointed layer's recompute skips the MLP's down projection where the architecture allows
# (kernels/arch.py mlp_feeds_residual); the bench switch fulldown turns it off for an A/B
SKIP_DOWN_IN_RECOMPUTE = True
SWIGLU_ACTS = {"SiLU", "SiLUActivation"}
GEGLU_ACTS = {"GELUTanh", "PytorchGELUTanh", "NewGELUActivation", "FastGELUActivation"}
# kernels.patch's tag: its _restore() drops the instance forward and every _fusetune_* attribute of
# a tagged module, so a later patch_model() call (or backend="torch") undoes these patches as well
PATCH_TAG = "_fusetune_patch"

# Phi-3 style fused projections: fused as one lone LoRA Linear each, but not as lora_qkv / lora_mlp
FUSED_PROJECTIONS = {
    "qkv_proj": ("lora_qkv", "fused qkv_proj (phi3-style): its LoRA runs as one lora_linear"),
    "gate_up_proj": ("lora_mlp", "fused gate_up_proj (phi3-style): its LoRA runs as one lora_linear"),
}


def _is_lora_layer(module) -> bool:
    return hasattr(module, "lora_A") and hasattr(module, "base_layer") and hasattr(module, "scaling")


def _base_reason(base, name: str) -> str | None:
    """Why a base layer (under LoRA or on its own) cannot be a fused projection, or None."""
    cls = type(base).__name__
    if isinstance(base, Fp8Linear):   # kernels.fp8_patch: frozen FP8 codes, always fusable
        return None
    if cls == "Linear4bit" or hasattr(base.weight, "quant_state"):
        qtype = getattr(getattr(base.weight, "quant_state", None), "quant_type", None)
        if qtype is None and hasattr(base.weight, "full_tensor"):   # jobs/train/sharding.py (FSDP-QLoRA)
            return (f"{name}: 4-bit weight sharded by FSDP (the fused NF4 path needs the whole codes and their "
                    "quant state; bitsandbytes' matmul runs on the gathered ones)")
        if qtype != "nf4":
            return f"{name}: 4-bit quant_type {qtype!r} (only nf4 is fused)"
    elif not isinstance(base, torch.nn.Linear) or cls != "Linear":
        return f"{name}: {cls} base layer"
    if base.weight.requires_grad:
        return f"{name}: base weight is trainable"
    if base.bias is not None and base.bias.requires_grad:
        return f"{name}: base bias is trainable"
    return None


def lora_reason(module, name: str) -> str | None:
    """Why a PEFT LoRA layer cannot take the fused path (None: it can)."""
    if type(module).__name__ not in ("Linear", "Linear4bit"):
        return f"{name}: PEFT {type(module).__name__} layer"
    if getattr(module, "fan_in_fan_out", False):
        return f"{name}: fan_in_fan_out"
    adapters = list(module.active_adapters)
    if len(adapters) != 1 or adapters[0] not in module.lora_A:
        return f"{name}: {len(adapters)} active adapters (fused path takes exactly one)"
    adapter = adapters[0]
    if module.use_dora.get(adapter, False):
        return f"{name}: DoRA"
    if adapter in getattr(module, "lora_variant", {}):
        return f"{name}: LoRA variant {type(module.lora_variant[adapter]).__name__}"
    dropout = module.lora_dropout[adapter]
    if isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
        return f"{name}: lora_dropout={dropout.p} > 0"
    if module.lora_bias.get(adapter, False) or module.lora_B[adapter].bias is not None:
        return f"{name}: bias on lora_B"
    return _base_reason(module.get_base_layer(), name)


def projection_reason(module, name: str) -> str | None:
    if _is_lora_layer(module):
        return lora_reason(module, name)
    if isinstance(module, torch.nn.Module) and hasattr(module, "weight"):
        return _base_reason(module, name)
    return f"{name}: {type(module).__name__}"


def _base(module):
    return module.base_layer if _is_lora_layer(module) else module


def _weight(module):
    return _base(module).weight


def _base_weight(base):
    """What the fused ops take as W: FP8 codes + scales, or the weight tensor itself."""
    return base.fp8_weight if isinstance(base, Fp8Linear) else base.weight


def compute_dtype(modules, x: torch.Tensor) -> torch.dtype:
    """NF4 layers compute in their quant_state dtype (bitsandbytes casts the input to it, e.g. bf16
    while prepare_model_for_kbit_training's fp32 norms hand over fp32); plain layers in x's dtype."""
    for module in modules:
        state = getattr(_weight(module), "quant_state", None)
        if state is not None:
            return state.dtype
    return x.dtype


def live_adapters(modules, adapters, x: torch.Tensor, dtype: torch.dtype) -> tuple | None:
    """Cheap per-call check that the state the patch saw still holds: the adapter each projection
    runs with now, or None when this call must take the modules' own forward. Under PEFT's
    `disable_adapter()` a LoRA projection runs as its base layer alone (adapter None) through the
    same fused kernels: DPO's, KTO's and GRPO's reference passes are whole forwards with the adapter
    off, and PEFT's per-projection forwards there cost host time a step (bench/NOTES.md)."""
    live = []
    for module, adapter in zip(modules, adapters):
        if adapter is not None:
            if module.merged or module.active_adapters != [adapter]:
                return None
            adapter = None if module.disable_adapters else adapter
        weight = _weight(module)
        quantized = getattr(weight, "quant_state", None) is not None or isinstance(_base(module), Fp8Linear)
        if not quantized and weight.dtype != dtype:
            return None
        live.append(adapter)
    return tuple(live) if x.is_floating_point() and triton_runs_on(x) else None


def projection(module, adapter: str | None) -> LoraProjection:
    if adapter is None:   # a plain frozen Linear, or a LoRA layer's base alone (adapter disabled)
        base = _base(module)
        return LoraProjection(_base_weight(base), None, None, 1.0, base.bias)
    base = module.base_layer
    return LoraProjection(_base_weight(base), module.lora_A[adapter].weight, module.lora_B[adapter].weight,
                          float(module.scaling[adapter]), base.bias)


def _adapter(module) -> str | None:
    return module.active_adapters[0] if _is_lora_layer(module) else None


def _patch_linear(module) -> None:
    adapter, original = _adapter(module), module.forward

    def fused_forward(x, *args, **kwargs):
        dtype = compute_dtype((module,), x)
        live = None if args or kwargs else live_adapters((module,), (adapter,), x, dtype)
        if live is None:
            return original(x, *args, **kwargs)
        p = projection(module, live[0])
        return as_dtype(lora_o(as_dtype(x, dtype), p.weight, p.lora_A, p.lora_B, p.scaling, p.bias), x.dtype)

    module.forward = fused_forward
    module._fusetune_lora = "lora_o"
    setattr(module, PATCH_TAG, "lora")


def _patch_qkv(attn) -> None:
    mods = (attn.q_proj, attn.k_proj, attn.v_proj)
    adapters = tuple(_adapter(m) for m in mods)

    def fusetune_qkv(hidden_states):
        dtype = compute_dtype(mods, hidden_states)
        live = live_adapters(mods, adapters, hidden_states, dtype)
        if live is None:
            return tuple(m(hidden_states) for m in mods)
        qkv = lora_qkv(as_dtype(hidden_states, dtype), *(projection(m, a) for m, a in zip(mods, live)))
        return tuple(as_dtype(t, hidden_states.dtype) for t in qkv)

    attn._fusetune_qkv = fusetune_qkv
    # a bound method, not the module: a Module attribute would be registered as a submodule and
    # show up twice in state_dict / the saved adapter
    attn._fusetune_o = attn.o_proj.__call__
    if not getattr(attn, PATCH_TAG, None):
        setattr(attn, PATCH_TAG, "lora")


def _activation(mlp) -> str | None:
    name = type(getattr(mlp, "act_fn", None)).__name__
    return "swiglu" if name in SWIGLU_ACTS else "geglu" if name in GEGLU_ACTS else None


def _patch_mlp(mlp, activation: str, feeds_residual: bool) -> None:
    """feeds_residual: the layer adds the MLP's output to its residual and nothing else reads it, so
    in a checkpointed layer's recompute (whose output is thrown away) the down projection is skipped."""
    mods = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    adapters = tuple(_adapter(m) for m in mods)
    original = mlp.forward

    def fused_forward(x, *args, **kwargs):
        dtype = compute_dtype(mods, x)
        live = None if args or kwargs else live_adapters(mods, adapters, x, dtype)
        if live is None:
            return original(x, *args, **kwargs)
        projections = (projection(m, a) for m, a in zip(mods, live))
        needed = not (feeds_residual and SKIP_DOWN_IN_RECOMPUTE and recomputing())
        return as_dtype(lora_mlp(as_dtype(x, dtype), *projections, activation=activation, output_needed=needed),
                        x.dtype)

    mlp.forward = fused_forward
    mlp._fusetune_lora = "lora_mlp"
    setattr(mlp, PATCH_TAG, "lora")


def _has_lora(mods) -> bool:
    return any(_is_lora_layer(m) for m in mods)


def _group_reason(owner, names) -> str | None:
    for name in names:
        reason = projection_reason(getattr(owner, name), name)
        if reason:
            return reason
    return None


def _find_groups(model):
    """(attention modules, MLP modules, [(attribute name, LoRA layer)], Counter of group fallbacks)."""
    attentions, mlps, linears, fallbacks = [], [], [], Counter()
    for qualified, module in model.named_modules():
        if all(isinstance(getattr(module, n, None), torch.nn.Module) for n in ("q_proj", "k_proj", "v_proj")):
            attentions.append(module)
        elif all(isinstance(getattr(module, n, None), torch.nn.Module) for n in ("gate_proj", "up_proj", "down_proj")):
            mlps.append(module)
        for fused_name, op_reason in FUSED_PROJECTIONS.items():
            if _is_lora_layer(getattr(module, fused_name, None)):
                fallbacks[op_reason] += 1
        if _is_lora_layer(module):
            linears.append((qualified.rsplit(".", 1)[-1], module))
    return attentions, mlps, linears, fallbacks


def _members(owners, names) -> set[int]:
    return {id(getattr(owner, n)) for owner in owners for n in names}


def _plan(model):
    """What to patch and what falls back.

    Returns (attentions for lora_qkv, [(mlp, activation)], [(op, linear, reported)], fallbacks).
    Every fusable LoRA Linear is patched on its own as well; it is *reported* as lora_o /
    lora_linear only outside a fused group, and its fallback only outside any group (the group's
    entry already carries the reason).
    """
    attentions, mlps, linears, fallbacks = _find_groups(model)
    qkv_names, mlp_names = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj", "down_proj")
    attentions = [a for a in attentions if _has_lora([getattr(a, n) for n in qkv_names])]
    mlps = [m for m in mlps if _has_lora([getattr(m, n) for n in mlp_names])]
    qkv, mlp_plan = [], []
    for attn in attentions:
        reason = _group_reason(attn, qkv_names)
        if reason:
            fallbacks[("lora_qkv", reason)] += 1
        else:
            qkv.append(attn)
    for mlp in mlps:
        activation = _activation(mlp)
        reason = _group_reason(mlp, mlp_names) or (
            None if activation else f"activation {type(getattr(mlp, 'act_fn', None)).__name__} not fused")
        if reason:
            fallbacks[("lora_mlp", reason)] += 1
        else:
            mlp_plan.append((mlp, activation))
    grouped = _members(attentions, qkv_names) | _members(mlps, mlp_names)
    fused = _members(qkv, qkv_names) | _members([m for m, _ in mlp_plan], mlp_names)
    linear_plan = []
    for name, module in linears:
        op = "lora_o" if name == "o_proj" else "lora_linear"
        reason = lora_reason(module, name)
        if reason and id(module) not in grouped:
            fallbacks[(op, reason)] += 1
        elif not reason:
            linear_plan.append((op, module, id(module) not in fused))
    return qkv, mlp_plan, linear_plan, fallbacks


def patch_lora_layers(model, report, use_triton: bool) -> None:
    """Fuse the PEFT LoRA layers of `model` (plain or PEFT-wrapped) in place; see the module doc.

    use_triton False: nothing is replaced, every LoRA group is reported as a fallback.
    """
    qkv, mlp_plan, linear_plan, fallbacks = _plan(model)
    if not use_triton:
        reason = "Triton not used (backend torch or no CUDA device)"
        for op, n in (("lora_qkv", len(qkv)), ("lora_mlp", len(mlp_plan)),
                      *Counter(op for op, _, reported in linear_plan if reported).items()):
            if n:
                report.fallback(op, n, reason)
    else:
        linear_counts: Counter = Counter()
        for op, module, reported in linear_plan:
            if getattr(module, "_fusetune_lora", None) is None:
                _patch_linear(module)
            linear_counts[op] += reported
        for attn in qkv:
            _patch_qkv(attn)
        _, arch = find_arch(base_model(model).config)
        for mlp, activation in mlp_plan:
            if getattr(mlp, "_fusetune_lora", None) is None:
                _patch_mlp(mlp, activation, feeds_residual=arch is not None and arch.mlp_feeds_residual)
        if qkv:
            report.patched("lora_qkv", len(qkv))
        if mlp_plan:
            report.patched("lora_mlp", len(mlp_plan))
        for op, n in sorted(linear_counts.items()):
            if n:
                report.patched(op, n)
        if qkv:
            report.note("lora_qkv runs where the attention forward calls attn._fusetune_qkv; "
                        "q/k/v projections are otherwise fused one by one (lora_linear)")
    for (op, reason), n in sorted(fallbacks.items()):
        report.fallback(op, n, reason)
