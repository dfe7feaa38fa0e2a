"""The model and LoRA shape as the fit check counts it: widths from a transformers config, the
weights' bytes by storage (bf16, NF4, fp8) and the adapter's parameters (jobs/models/fit.py)."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ShapeUnknown(ValueError):
    """A model config the fit check cannot count (a width missing, or per layer rather than one number): the
    one error a budget plan may fall back on; any other error from the arithmetic is a bug and surfaces."""


_REQUIRED = object()


def _width(config, name: str, default=_REQUIRED):
    """config.<name> as a positive int; `default` when given and the field is absent or None."""
    value = getattr(config, name, None)
    if value is None and default is not _REQUIRED:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:   # numpy ints pass
        found = ("missing" if value is None else f"a list of {len(value)} values"
                 if isinstance(value, (list, tuple)) else repr(value))
        raise ShapeUnknown(f"the model config's {name} is {found}, not one positive number")
    return int(value)


@dataclass(frozen=True)
class _Shape:
    hidden: int
    inter: int
    layers: int
    q: int       # query width (heads x head_dim)
    kv: int      # key (= value) width
    vocab: int
    tied: bool
    # the fused engine's recompute skips the MLP's down projection (kernels/arch.py mlp_feeds_residual)
    mlp_feeds_residual: bool = False

    @classmethod
    def of(cls, model_config) -> "_Shape":
        """Raises ShapeUnknown, naming the field, for a config the fit check cannot count."""
        from kernels.arch import find_arch, text_config
        c = text_config(model_config)
        arch = find_arch(model_config)[1]
        heads = _width(c, "num_attention_heads")
        head_dim = _width(c, "head_dim", None) or _width(c, "hidden_size") // heads
        kv_heads = _width(c, "num_key_value_heads", None) or heads
        tied = getattr(c, "tie_word_embeddings", None)   # image-text models keep it on the outer config
        tied = getattr(model_config, "tie_word_embeddings", False) if tied is None else tied
        return cls(_width(c, "hidden_size"), _width(c, "intermediate_size"), _width(c, "num_hidden_layers"),
                   heads * head_dim, kv_heads * head_dim, _width(c, "vocab_size"), bool(tied),
                   arch is not None and arch.mlp_feeds_residual)

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each decoder projection."""
        h, i = self.hidden, self.inter
        return {"q_proj": (h, self.q), "k_proj": (h, self.kv), "v_proj": (h, self.kv), "o_proj": (self.q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def linear_weights(self) -> int:
        return self.layers * sum(a * b for a, b in self.projections().values())

    def recompute_share(self, fused: bool) -> float:
        """A recomputed layer's GEMM work as a share of its forward's: less the MLP's down projection
        where the fused engine skips it (kernels/lora_patch.py)."""
        if not (fused and self.mlp_feeds_residual):
            return 1.0
        inner, outer = self.projections()["down_proj"]
        return 1.0 - self.layers * inner * outer / self.linear_weights()

    def embedding_weights(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)


def _dtype_bytes(spec, cuda: bool) -> int:
    if spec.dtype == "fp32" or (spec.dtype == "auto" and not cuda):
        return 4
    return 2


def _targets(spec) -> tuple[str, ...]:
    if spec.target_modules == "all-linear":
        return ALL_LINEAR
    named = tuple(spec.target_modules)
    fused_names = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    return tuple(t for name in named for t in fused_names.get(name, (name,)) if t in ALL_LINEAR)


def lora_params(spec, shape: _Shape) -> int:
    projections = shape.projections()
    return shape.layers * sum(spec.lora_r * sum(projections[t]) for t in _targets(spec))


def _weights(spec, shape: _Shape, b: int, fused: bool) -> dict[str, int]:
    linear, embed = shape.linear_weights(), shape.embedding_weights()
    if spec.load_in_4bit:
        parts = {"base weights (NF4)": int(linear * NF4_BYTES_PER_WEIGHT), "embeddings": embed * b}
        if fused:
            shapes = {tuple(sorted(p)) for p in shape.projections().values()}
            parts["NF4 dequant buffers"] = sum(a * c for a, c in shapes) * b
        return parts
    if spec.base_precision == "fp8":
        return {"base weights (fp8)": linear, "embeddings": embed * b}
    return {"base weights": (linear + embed) * b}
