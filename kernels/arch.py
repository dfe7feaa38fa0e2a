"""The architectures `patch_model` knows, keyed by `config.model_type`.

Each row records what differs between the decoder families as transformers 5.x writes them
(read from modeling_llama/mistral/qwen2/qwen3/gemma/gemma2/gemma3/phi3.py, 5.17 and 5.24):
- norm_offset: 0.0 for `LlamaRMSNorm` (`w * x_hat.to(dtype)`), 1.0 for `GemmaRMSNorm` ((1 + w) in fp32).
- act_config_key: the config field `ACT2FN` reads for the MLP (`hidden_act` or `hidden_activation`).
- qk_norm: Qwen3 and Gemma3 normalise every query/key head (q_norm/k_norm) before RoPE.
- fused_qkv / fused_gate_up: Phi-3 packs q,k,v into `qkv_proj` and gate,up into `gate_up_proj`.
- sliding_window: where the attention forward reads the `sliding_window` kwarg it passes to the
  attention interface ("module": `self.sliding_window`, "config": `config.sliding_window`, None: not passed).
- attn_softcap: Gemma2 passes `softcap=self.attn_logit_softcapping` to the attention interface.
- final_logit_softcap: Gemma2/3 soft-cap the logits; a fused loss must apply it (helper B's loss patch).
- mlp_feeds_residual: the MLP's output goes straight into the residual sum that ends the layer, so a
  checkpointed layer's recompute may skip the down projection (kernels/lora_patch.py). Gemma2/3
  normalise it first (post_feedforward_layernorm, whose backward reads it); Phi-3 drops it out.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    model_type: str
    class_prefix: str            # transformers class names: f"{prefix}RMSNorm", "MLP", "Attention"
    norm_offset: float
    act_config_key: str
    qk_norm: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    sliding_window: str | None = None
    attn_softcap: bool = False
    final_logit_softcap: bool = False
    mlp_name: str | None = None  # the decoder MLP's class when it is not f"{prefix}MLP" (Qwen2-VL: Qwen2MLP)
    mlp_feeds_residual: bool = True

    @property
    def norm_class(self) -> str:
        return f"{self.class_prefix}RMSNorm"

    @property
    def mlp_class(self) -> str:
        return self.mlp_name or f"{self.class_prefix}MLP"

    @property
    def attention_class(self) -> str:
        return f"{self.class_prefix}Attention"


ARCHITECTURES: dict[str, ArchSpec] = {
    spec.model_type: spec
    for spec in (
        ArchSpec("llama", "Llama", 0.0, "hidden_act"),
        ArchSpec("mistral", "Mistral", 0.0, "hidden_act", sliding_window="config"),
        ArchSpec("qwen2", "Qwen2", 0.0, "hidden_act", sliding_window="module"),
        ArchSpec("qwen3", "Qwen3", 0.0, "hidden_act", qk_norm=True, sliding_window="module"),
        ArchSpec("gemma", "Gemma", 1.0, "hidden_act"),
        ArchSpec("gemma2", "Gemma2", 1.0, "hidden_activation", sliding_window="module",
                 attn_softcap=True, final_logit_softcap=True, mlp_feeds_residual=False),
        ArchSpec("gemma3_text", "Gemma3", 1.0, "hidden_activation", qk_norm=True,
                 sliding_window="module", final_logit_softcap=True, mlp_feeds_residual=False),
        ArchSpec("phi3", "Phi3", 0.0, "hidden_act", fused_qkv=True, fused_gate_up=True,
                 sliding_window="config", mlp_feeds_residual=False),
    )
}

# The language models inside vision-language models (jobs/models/vision.py), keyed by their text
# config's model_type. Qwen2-VL's multimodal RoPE (M-RoPE: temporal, height and width position
# sections) is merged into one cos/sin per token by the rotary embedding itself
# (`Qwen2VLRotaryEmbedding.forward` in 5.24), so the attention rotates as a text model does and
# the fused `rope` applies; the vision tower's own attention is not in the table: its rotary stays
# PyTorch and its attention runs one varlen launch a block (kernels/vision_attention.py).
# The vision MLP is `Qwen2_5_VLMLP`/`VisionMlp`, the decoder's `Qwen2MLP`; Qwen2.5-VL's vision
# blocks share the decoder's RMSNorm class, so their norms are fused too (same maths).
VISION_LANGUAGE: dict[str, ArchSpec] = {
    spec.model_type: spec
    for spec in (
        ArchSpec("qwen2_vl_text", "Qwen2VL", 0.0, "hidden_act", sliding_window="module", mlp_name="Qwen2MLP"),
        ArchSpec("qwen2_5_vl_text", "Qwen2_5_VL", 0.0, "hidden_act", sliding_window="module",
                 mlp_name="Qwen2MLP"),
    )
}

# config activation name -> (fused op, GELU approximation); ACT2FN's names in transformers.activations
GATED_ACTIVATIONS: dict[str, tuple[str, str | None]] = {
    "silu": ("swiglu", None),
    "swish": ("swiglu", None),
    "gelu_pytorch_tanh": ("geglu", "tanh"),
    "gelu_new": ("geglu", "tanh"),
    "gelu": ("geglu", "none"),
}


def text_config(model_config):
    """The decoder's config (multimodal configs nest it; `get_text_config` exists in 5.x)."""
    getter = getattr(model_config, "get_text_config", None)
    return getter() if callable(getter) else model_config


def find_arch(model_config) -> tuple[str | None, ArchSpec | None]:
    """(model_type, table row or None) for a transformers config."""
    model_type = getattr(text_config(model_config), "model_type", None)
    return model_type, ARCHITECTURES.get(model_type) or VISION_LANGUAGE.get(model_type)


def base_model(model):
    """The transformers model under a PEFT wrapper (or the model itself)."""
    getter = getattr(model, "get_base_model", None)
    return getter() if callable(getter) else model


def decoder_layers(model) -> list:
    """The model's decoder layers in forward order (transformers' GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in base_model(model).modules() if isinstance(m, GradientCheckpointingLayer)]
