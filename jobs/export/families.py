"""The architecture table for GGUF: which Hugging Face models map to which llama.cpp architecture,
the hyperparameters llama.cpp reads, and the tensor names and layout changes it expects.

Following llama.cpp's convert_hf_to_gguf.py (LlamaModel, Qwen2Model, TextModel.set_gguf_parameters):
- llama and mistral are llama.cpp's `llama` architecture; its RoPE rotates interleaved pairs where
  transformers rotates halves, so q_proj and k_proj rows are permuted (`permute_rows` below, the
  converter's `LlamaModel.permute`). Llama 3.1's `rope_type: llama3` becomes a `rope_freqs` tensor.
- qwen2 is its own architecture (NeoX-style RoPE, so no permutation) with q/k/v biases.
Names come from the gguf package's tensor-name map."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import gguf
import torch

from jobs.messages import say
from jobs.export.files import ExportError


@dataclass(frozen=True)
class Family:
    name: str
    arch: gguf.MODEL_ARCH
    permute_qk: bool

    @property
    def arch_name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]


FAMILIES = {
    "LlamaForCausalLM": Family("llama", gguf.MODEL_ARCH.LLAMA, permute_qk=True),
    "MistralForCausalLM": Family("mistral", gguf.MODEL_ARCH.LLAMA, permute_qk=True),
    "Qwen2ForCausalLM": Family("qwen2", gguf.MODEL_ARCH.QWEN2, permute_qk=False),
}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SKIPPED_SUFFIXES = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")


def supported_list() -> str:
    return ", ".join(f"{f.name} ({arch})" for arch, f in FAMILIES.items())


def family_of(config: dict) -> Family:
    """The family of a base config.json, or an ExportError listing the supported ones."""
    if config.get("vision_config") is not None:
        raise ExportError(say("export_vision_gguf", model_type=config.get("model_type", "unknown")))
    architecture = (config.get("architectures") or [MODEL_TYPES.get(config.get("model_type", ""), "")])[0]
    family = FAMILIES.get(architecture)
    if family is None:
        shown = architecture or config.get("model_type", "unknown")
        raise ExportError(say("export_architecture", architecture=shown, supported=supported_list()))
    return family


def head_counts(config: dict) -> tuple[int, int, int]:
    """(heads, kv heads, head dim)."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return heads, kv_heads, head_dim


def permute_rows(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """transformers' half-split RoPE layout -> llama.cpp's interleaved one, per head, on rows
    (convert_hf_to_gguf.py's LlamaModel.permute; also right for a LoRA B matrix or a bias)."""
    shape = weight.shape
    return (weight.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def qk_heads(family: Family, config: dict, hf_name: str) -> int | None:
    """How many heads to permute this tensor's rows over, or None to leave it as it is."""
    if not family.permute_qk:
        return None
    heads, kv_heads, _ = head_counts(config)
    if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
        return heads
    if hf_name.endswith(("k_proj.weight", "k_proj.bias")):
        return kv_heads
    return None


class TensorNames:
    """HF parameter name -> GGUF tensor name for one model."""

    def __init__(self, family: Family, config: dict):
        self.mapping = gguf.get_tensor_name_map(family.arch, config["num_hidden_layers"])

    def gguf_name(self, hf_name: str) -> str | None:
        """None for tensors llama.cpp does not want (rotary caches)."""
        if hf_name.endswith(SKIPPED_SUFFIXES):
            return None
        name = self.mapping.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(say("export_tensor_unplaced", tensor=hf_name, supported=supported_list()))
        return name


def rope_parameters(config: dict) -> dict:
    """transformers 5 writes `rope_parameters`, earlier versions `rope_scaling` + `rope_theta`."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    rope.setdefault("rope_type", rope.get("type", "default"))
    return rope


def add_hparams(writer: gguf.GGUFWriter, family: Family, config: dict, file_type: gguf.LlamaFileType) -> None:
    """The architecture keys llama.cpp reads (TextModel.set_gguf_parameters and the family's own)."""
    heads, kv_heads, head_dim = head_counts(config)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    rope = rope_parameters(config)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    if config.get("head_dim"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if family.arch == gguf.MODEL_ARCH.LLAMA:
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim)
    kind, factor = rope["rope_type"], rope.get("factor")
    if kind == "linear" and factor:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(factor)
    elif kind == "yarn" and factor:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(factor)
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    elif kind not in ("default", "llama3"):
        raise ExportError(say("export_rope_scaling", kind=kind))
    writer.add_file_type(file_type)


def extra_tensors(family: Family, config: dict) -> Iterable[tuple[str, torch.Tensor]]:
    """Llama 3.1's frequency scaling as llama.cpp's `rope_freqs` tensor (LlamaModel.generate_extra_tensors)."""
    rope = rope_parameters(config)
    if family.arch != gguf.MODEL_ARCH.LLAMA or rope["rope_type"] != "llama3":
        return []
    _, _, dim = head_counts(config)
    freqs = 1.0 / (float(rope["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_context = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_context / low, old_context / high
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return [(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", torch.tensor(factors))]
