"""`patch_model`: swap the fused Triton ops into a transformers model, instance by instance.

What it replaces (per module instance, by binding a new `forward`; library source is never edited):
- every `<Arch>RMSNorm` (decoder norms, final norm, Qwen3/Gemma3 q_norm/k_norm) -> `rms_norm`
- every `<Arch>MLP` -> the same projections around `swiglu` / `geglu` instead of act_fn(gate) * up
- every `<Arch>Attention` -> the same projections and transformers' own attention interface, with
  `rope` rotating Q and K in place in one launch instead of `apply_rotary_pos_emb`
then hands over to helper modules for LoRA fusion (`kernels.lora_patch`), the fused
linear + cross-entropy loss (`kernels.loss_patch`) and an image-text model's vision attention
(`kernels.vision_attention`: one varlen launch a tower block). With `base_precision="fp8"` the frozen decoder
linears are first swapped for FP8 ones (`kernels.fp8_patch`), which the LoRA fusion then runs as
scaled FP8 GEMMs. Anything it cannot do keeps the PyTorch
module and the returned `PatchReport` says which and why. Calling it again first undoes its own
earlier patches, so it never stacks wrappers.
"""
from __future__ import annotations

import functools
import importlib
import os
import types

import torch

from kernels.arch import ARCHITECTURES, GATED_ACTIVATIONS, ArchSpec, base_model, find_arch, text_config
from kernels.ops.geglu import geglu
from kernels.ops.rms_norm import rms_norm
from kernels.ops.rope import rope
from kernels.ops.swiglu import swiglu
from kernels.report import PatchReport

BACKENDS = ("auto", "triton", "torch")
PATCH_TAG = "_fusetune_patch"
HELPERS = (  # (module, function, op label used when the helper is missing)
    ("kernels.lora_patch", "patch_lora_layers", "lora"),
    ("kernels.loss_patch", "patch_causal_lm_loss", "fused_linear_cross_entropy"),
    ("kernels.vision_attention", "use_vision_varlen_attention", "vision_attention"),
)


def _resolve_backend(model: torch.nn.Module, backend: str) -> tuple[str, str]:
    """("triton" or "torch", the reason when torch)."""
    if backend not in BACKENDS:
        raise ValueError(f"patch_model: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch", "backend='torch' requested"
    param = next(model.parameters(), None)
    on_cuda = param is not None and param.is_cuda
    if on_cuda:
        return "triton", ""
    where = param.device.type if param is not None else "no parameters"
    if backend == "auto":
        return "torch", f"no CUDA device: the model's parameters are on {where}"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "triton", ""
    return "torch", (f"backend='triton' needs the model on CUDA (parameters are on {where}); "
                     "set TRITON_INTERPRET=1 to run the kernels in the CPU interpreter")


def _restore(model: torch.nn.Module) -> None:
    """Undo this module's earlier patches (drop the instance-level forward)."""
    for module in model.modules():
        if getattr(module, PATCH_TAG, None):
            module.__dict__.pop("forward", None)
            for name in [n for n in module.__dict__ if n.startswith("_fusetune_")]:
                delattr(module, name)


def _bind(module: torch.nn.Module, forward, tag: str, **state) -> None:
    for name, value in state.items():
        setattr(module, f"_fusetune_{name}", value)
    module._fusetune_original_forward = module.forward
    module.forward = types.MethodType(forward, module)
    setattr(module, PATCH_TAG, tag)


def _instances(model: torch.nn.Module, class_name: str) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == class_name]


def _hooked(module: torch.nn.Module) -> bool:
    # Another library (e.g. an accelerate dispatch hook) already replaced this instance's forward.
    return "forward" in module.__dict__


# ---- patched forwards ---------------------------------------------------------------------------

def _rms_norm_forward(self, hidden_states):
    return rms_norm(hidden_states, self.weight, self._fusetune_eps, self._fusetune_offset)


def _mlp_forward(self, x):
    return self.down_proj(self._fusetune_act(self.gate_proj(x), self.up_proj(x)))


def _fused_gate_up_mlp_forward(self, x):
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(self._fusetune_act(gate, up))


def _project_qkv(self, hidden_states, spec: ArchSpec):
    """q, k, v as [batch, seq, heads, head_dim], q/k already head-normalised where the arch does."""
    hidden_shape = (*hidden_states.shape[:-1], -1, self.head_dim)
    if spec.fused_qkv:
        qkv = self.qkv_proj(hidden_states)
        q_size = self.config.num_attention_heads * self.head_dim
        kv_size = self.config.num_key_value_heads * self.head_dim
        # slices, not split(): rope bumps qkv's version, which autograd cannot rebase onto the
        # outputs of a multi-view op such as split
        q, k, v = qkv[..., :q_size], qkv[..., q_size:q_size + kv_size], qkv[..., q_size + kv_size:]
    elif hasattr(self, "_fusetune_qkv"):  # kernels.lora_patch's seam: the three LoRA projections fused
        q, k, v = self._fusetune_qkv(hidden_states)
    else:
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
    q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)
    if spec.qk_norm:  # per-head RMSNorm over head_dim: same result before or after the transpose
        q, k = self.q_norm(q), self.k_norm(k)
    return q, k, v


def _attention_kwargs(self, spec: ArchSpec) -> dict:
    extra = {}
    if spec.sliding_window == "module":
        extra["sliding_window"] = self.sliding_window
    elif spec.sliding_window == "config":
        extra["sliding_window"] = getattr(self.config, "sliding_window", None)
    if spec.attn_softcap:
        extra["softcap"] = self.attn_logit_softcapping
    return extra


def _attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    """transformers' <Arch>Attention.forward (5.17 and 5.24) with `rope` in place of
    `apply_rotary_pos_emb`. The KV cache argument is `past_key_values` in 5.17 and `cache` in 5.24
    (which also hands the remaining kwargs to `cache.update`); whichever name came in is honoured."""
    if position_embeddings is None:
        return self._fusetune_original_forward(hidden_states, position_embeddings, attention_mask, **kwargs)
    cache_name = "cache" if "cache" in kwargs else "past_key_values"
    cache = kwargs.pop(cache_name, None)
    spec = self._fusetune_spec
    q, k, v = _project_qkv(self, hidden_states, spec)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = position_embeddings
    q, k = rope(q, k, cos, sin)
    if cache is not None:
        update_kwargs = {"kwargs": kwargs} if cache_name == "cache" else {}
        k, v = cache.update(k, v, self.layer_idx, **update_kwargs)
    interface = self._fusetune_attention_functions.get_interface(
        self.config._attn_implementation, self._fusetune_eager_attention)
    attn_output, attn_weights = interface(
        self, q, k, v, attention_mask,
        dropout=self.attention_dropout if self.training else 0.0,
        scaling=self.scaling, **_attention_kwargs(self, spec), **kwargs,
    )
    attn_output = attn_output.reshape(*hidden_states.shape[:-1], -1).contiguous()
    return self.o_proj(attn_output), attn_weights


# ---- per-family patchers ------------------------------------------------------------------------

def _patch_norms(model, spec: ArchSpec, report: PatchReport) -> None:
    norms = _instances(model, spec.norm_class)
    hooked = [m for m in norms if _hooked(m)]
    for module in norms:
        if module not in hooked:
            eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
            _bind(module, _rms_norm_forward, "rms_norm", eps=float(eps), offset=spec.norm_offset)
    if len(norms) > len(hooked):
        report.patched("rms_norm", len(norms) - len(hooked))
    if hooked:
        report.fallback("rms_norm", len(hooked), "forward already replaced by another library (hook)")


def _mlp_activation(model_config, spec: ArchSpec):
    """(op name, callable) for the arch's gated activation, or (name, None) when not fused."""
    act_name = getattr(text_config(model_config), spec.act_config_key, None)
    op_name, approximate = GATED_ACTIVATIONS.get(act_name, (f"mlp_activation[{act_name}]", None))
    if op_name == "swiglu":
        return op_name, swiglu
    if op_name == "geglu":
        return op_name, functools.partial(geglu, approximate=approximate)
    return op_name, None


def _patch_mlps(model, model_config, spec: ArchSpec, report: PatchReport) -> None:
    mlps = _instances(model, spec.mlp_class)
    op_name, act = _mlp_activation(model_config, spec)
    if act is None:
        report.fallback(op_name, len(mlps), "this activation has no fused gated kernel "
                        f"(fused: {', '.join(sorted(GATED_ACTIVATIONS))})")
        return
    forward = _fused_gate_up_mlp_forward if spec.fused_gate_up else _mlp_forward
    needed = ("gate_up_proj",) if spec.fused_gate_up else ("gate_proj", "up_proj")
    usable = [m for m in mlps if not _hooked(m) and all(hasattr(m, n) for n in needed + ("down_proj",))]
    for module in usable:
        _bind(module, forward, op_name, act=act)
    if usable:
        report.patched(op_name, len(usable))
    if len(mlps) > len(usable):
        report.fallback(op_name, len(mlps) - len(usable),
                        "MLP layout differs from the table (missing projections) or forward is hooked")


def _patch_attention(model, spec: ArchSpec, report: PatchReport) -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    layers = _instances(model, spec.attention_class)
    usable = [m for m in layers if not _hooked(m) and hasattr(m, "head_dim")]
    for module in usable:
        modeling = importlib.import_module(type(module).__module__)
        _bind(module, _attention_forward, "rope", spec=spec,
              attention_functions=ALL_ATTENTION_FUNCTIONS,
              eager_attention=modeling.eager_attention_forward)
    if usable:
        report.patched("rope", len(usable))
    if len(layers) > len(usable):
        report.fallback("rope", len(layers) - len(usable),
                        "attention layout differs from the table or forward is hooked")


def _run_helpers(model, report: PatchReport, use_triton: bool) -> None:
    for module_name, function_name, op in HELPERS:
        try:
            helper = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            report.fallback(op, 0, f"{module_name} is not built yet")
            continue
        getattr(helper, function_name)(model, report, use_triton=use_triton)


def _quantize_base(model, base_precision: str, report: PatchReport, use_triton: bool) -> None:
    from kernels.fp8_patch import PRECISIONS, quantize_base_fp8

    if base_precision not in PRECISIONS:
        raise ValueError(f"patch_model: base_precision must be one of {PRECISIONS}, got {base_precision!r}")
    if base_precision == "fp8":
        quantize_base_fp8(model, report, use_triton=use_triton)
    elif any(type(m).__name__ == "Fp8Linear" for m in model.modules()):
        report.note("base weights were made FP8 by an earlier patch_model call and stay FP8")


def patch_model(model: torch.nn.Module, backend: str = "auto", base_precision: str = "bf16") -> PatchReport:
    """Patch `model` (a transformers causal LM, plain or PEFT-wrapped) in place; return the report.

    backend: "auto" (Triton when the parameters are on CUDA, else torch), "triton" (also on CPU
    under TRITON_INTERPRET=1, for tests) or "torch" (leave every module as transformers wrote it).
    base_precision: "bf16" (weights as loaded) or "fp8" (frozen decoder linears stored and multiplied
    in FP8 where the GPU can, see kernels/fp8_patch.py; the report says which layers).
    """
    resolved, reason = _resolve_backend(model, backend)
    base = base_model(model)
    model_type, spec = find_arch(base.config)
    report = PatchReport(backend=resolved, architecture=spec.model_type if spec else None)
    _restore(model)
    if spec is None:
        why = (f"unknown architecture {model_type!r}: fused kernels cover "
               f"{', '.join(sorted(ARCHITECTURES))}")
        for op in ("rms_norm", "rope", "mlp_activation", "lora", "fused_linear_cross_entropy"):
            report.fallback(op, 0, why)
        if base_precision == "fp8":
            report.fallback("fp8_linear", 0, why + "; base weights stay bf16")
        return report
    if resolved == "torch":
        for op in ("rms_norm", "rope", "mlp_activation"):
            report.fallback(op, 0, reason)
    else:
        if not next(base.parameters()).is_cuda:
            report.note("Triton kernels run in the interpreter on CPU tensors (TRITON_INTERPRET=1)")
        _patch_norms(base, spec, report)
        _patch_mlps(base, base.config, spec, report)
        _patch_attention(base, spec, report)
    _quantize_base(model, base_precision, report, use_triton=resolved == "triton")
    _run_helpers(model, report, use_triton=resolved == "triton")
    return report
