"""The vision tower's share of an image-text job's peak GPU memory (Qwen2-VL, Qwen2.5-VL), for
jobs/models/fit.py, whose decoder model reads the text config only (kernels.arch.text_config).

    vision = VisionShape.of(model_config)    # None for a text model (and image-text families not trained)
    vision.parameters()                       # == sum(p.numel()) of the built model's `model.visual`

What it adds (bytes; d = the tower's width, I = its MLP width, b = the training dtype's bytes):
- weights: patch embedding (Conv3d, no bias), `depth` blocks and the merger (the projector), in the
  dtype. load_in_4bit: bitsandbytes quantises every nn.Linear outside its skip list (lm_head, tied
  weights), so the tower's and merger's linear weights are NF4 like the decoder's (biases, norms and
  the Conv3d stay). base_precision fp8: kernels/fp8_patch.py swaps the frozen linears of every
  GradientCheckpointingLayer, which the vision blocks are too, when in and out are multiples of 16
  (Qwen2.5-VL-7B: qkv and proj; its I = 3420 is not); the merger stays.
- LoRA: r (in + out) per adapted linear, picked by jobs/models/vision.py's own rule (vision_lora, or
  the vit / aligner aliases), 16 B a parameter as the decoder's.
- patches P: the most one micro-batch can hold, every token an image token: batch_tokens x merge**2
  (an image token is one merge x merge group of patches, jobs/data/vision_encode.py; a row longer
  than max_seq_length is refused, not cut). The bench's 1024x768 image is 3,996 patches; a 4,096-token
  row bounds a micro-batch at 16,384.
- image inputs: pixel_values stay fp32 as the image processor returns them (P x channels x temporal
  x patch**2 x 4 B), for every micro-batch of an optimizer step (jobs/train/loop.py moves the whole
  accumulation group to the GPU at once).
- kept for backward: nothing without LoRA in the tower: frozen weights and pixel_values that need
  no grad build no graph (measured: 0 saved bytes). With LoRA on the blocks, per patch and block,
  everything an all-linear LoRA keeps: the fused engine 11 d + 2 I for Qwen2.5-VL (residual input,
  two norm outputs and the mid residual; the qkv output, which v's view holds; rotated q and k; the
  attention output as SDPA and as proj saved it; lora_mlp's gate and up) and 11 d + 3 I for Qwen2-VL
  (its LayerNorm and quick-GELU MLP stay PyTorch: fc1's output, the sigmoid, fc2's input). PyTorch's
  path keeps act(gate) and the product too (4 I for Qwen2.5-VL) and, below fp32, fp32 copies worth
  I + 2 d (RMSNorm towers) or I (LayerNorm). A recomputed block keeps its input (P d), an offloaded
  one nothing (two prefetch buffers in all). The merger keeps about 4 d a patch when it or the
  tower has LoRA.
- the tower's forward (it runs before the decoder, one block at a time) peaks at the vision RoPE:
  the residual and norm output, the qkv output (5 d in the dtype) and six fp32 temporaries of
  q and k (`apply_rotary_pos_emb_vision` computes in fp32), or in the MLP (3 d + 3 I); with the
  rotary cos and sin (fp32, head_dim each) the tower holds throughout, the pixels' copy in the dtype
  and the decoder's input embeddings. SDPA / flash attention: no P x P
  scores. The tower's backward (LoRA only, after the decoder's) holds one block's gradients,
  P (I + 3 d), as fit.py's decoder layers. These moments compete with the decoder's step, they do
  not add to it: only what exceeds the decoder's activations is added ("vision step transient").

Measured with autograd's saved-tensor hooks and a live-storage tracker on CPU (Qwen2.5-VL-7B's
widths d 1280, I 3420, and Qwen2-VL's I 5120; 256 and 1,024 patches; 2026-12-02), bytes a patch
and block: fused bf16 42,712 (formula 41,840) and 60,200 (58,880) for Qwen2-VL; PyTorch bf16 80,672
(79,440) and 77,128 (79,360); fp32 111,432 (111,040) and 118,096 (117,760); the frozen forward's
peak 44,176 (44,160) in bf16, 57,058 (57,040) and 77,456 (77,440) in fp32. All within 3 %;
tests/jobs/models/test_fit_vision.py measures the same on small towers.
"""
from __future__ import annotations

from dataclasses import dataclass

from jobs.models.fit_shape import ShapeUnknown

PIXEL_BYTES = 4     # pixel_values: the image processor's fp32, not cast on the way to the GPU
PREFIX = "model.visual"   # where transformers puts the tower (jobs/models/vision.py's markers read it)


@dataclass(frozen=True)
class VisionShape:
    family: str          # "qwen2_5_vl" (RMSNorm, SwiGLU) or "qwen2_vl" (LayerNorm, fc1/fc2)
    width: int           # d
    inter: int           # I
    depth: int
    heads: int
    out: int             # the merger's output: the decoder's hidden size
    patch_values: int    # one pixel_values row: channels x temporal x patch x patch
    merge: int           # spatial_merge_size

    @classmethod
    def of(cls, model_config) -> "VisionShape | None":
        c = getattr(model_config, "vision_config", None)
        family = getattr(model_config, "model_type", None)
        if c is None or family not in ("qwen2_5_vl", "qwen2_vl"):
            return None
        try:
            channels = getattr(c, "in_channels", None) or getattr(c, "in_chans", 3)
            values = channels * c.temporal_patch_size * c.patch_size ** 2
            if family == "qwen2_5_vl":
                return cls(family, c.hidden_size, c.intermediate_size, c.depth, c.num_heads, c.out_hidden_size,
                           values, c.spatial_merge_size)
            return cls(family, c.embed_dim, int(c.embed_dim * c.mlp_ratio), c.depth, c.num_heads, c.hidden_size,
                       values, c.spatial_merge_size)
        except (AttributeError, TypeError) as exc:   # reading the config only: the arithmetic's errors surface
            raise ShapeUnknown(f"the vision tower's config: {exc}") from exc

    @property
    def gated(self) -> bool:
        return self.family == "qwen2_5_vl"

    def linears(self) -> list[tuple[str, int, int]]:
        """(dotted name as the model names it, in, out) of every nn.Linear; all carry a bias."""
        d, i, merged = self.width, self.inter, self.width * self.merge ** 2
        mlp = ({"gate_proj": (d, i), "up_proj": (d, i), "down_proj": (i, d)} if self.gated
               else {"fc1": (d, i), "fc2": (i, d)})
        block = {"attn.qkv": (d, 3 * d), "attn.proj": (d, d), **{f"mlp.{k}": v for k, v in mlp.items()}}
        names = [(f"{PREFIX}.blocks.{n}.{k}", a, b) for n in range(self.depth) for k, (a, b) in block.items()]
        return names + [(f"{PREFIX}.merger.mlp.0", merged, merged), (f"{PREFIX}.merger.mlp.2", merged, self.out)]

    def parameters(self) -> int:
        """Every parameter of the tower and merger, as transformers builds them."""
        norm = self.width * (1 if self.gated else 2)            # RMSNorm: weight; LayerNorm: weight and bias
        norms = (2 * self.depth + 1) * norm                     # two a block, the merger's ln_q
        return self.patch_values * self.width + norms + self.linear_weights() + sum(b for _, _, b in self.linears())

    def linear_weights(self) -> int:
        return sum(a * b for _, a, b in self.linears())


def patches(spec, vision: VisionShape) -> int:
    """The most image patches one micro-batch can carry (module doc)."""
    return spec.batch_tokens() * vision.merge ** 2


def lora_names(spec, vision: VisionShape) -> list[str]:
    """The tower's and merger's linears that get LoRA, by the rule jobs/models/load.py applies."""
    from jobs.models.vision import lora_targets
    return lora_targets([name for name, _, _ in vision.linears()], spec.target_modules, spec.vision_lora)


def lora_params(spec, vision: VisionShape) -> int:
    chosen = set(lora_names(spec, vision))
    return sum(spec.lora_r * (a + b) for name, a, b in vision.linears() if name in chosen)


def trains_tower(spec, vision: VisionShape | None) -> bool:
    """Whether the blocks have LoRA, i.e. keep activations for backward (and can be planned to recompute)."""
    return vision is not None and any(".blocks." in name for name in lora_names(spec, vision))


def weight_bytes(spec, vision: VisionShape, b: int, nf4_bytes: float) -> int:
    """The tower's weights; `nf4_bytes`: fit.py's bytes a QLoRA weight takes (module doc)."""
    linear, rest = vision.linear_weights(), vision.parameters() - vision.linear_weights()
    if spec.load_in_4bit:
        return int(linear * nf4_bytes) + rest * b
    if spec.base_precision == "fp8":
        blocks = [(a, c) for name, a, c in vision.linears() if ".blocks." in name]
        fp8 = sum(a * c for a, c in blocks if a % 16 == 0 and c % 16 == 0)
        return fp8 + (linear - fp8) * b + rest * b
    return (linear + rest) * b


def block_kept_bytes(vision: VisionShape, b: int, fused: bool) -> int:
    """Per patch: what one LoRA'd block keeps for backward when not recomputed (module doc)."""
    d, i = vision.width, vision.inter
    if fused or not vision.gated:
        values = 11 * d + (2 if vision.gated and fused else 3) * i
    else:
        values = 11 * d + 4 * i
    fp32_copies = 0 if fused or b >= 4 else 4 * (i + 2 * d if vision.gated else i)
    return values * b + fp32_copies


def forward_transient_bytes(vision: VisionShape, b: int) -> int:
    """Per patch: the largest moment of one block's forward, with the rotary cos and sin (module doc)."""
    d, i = vision.width, vision.inter
    rotary = 2 * (d // vision.heads) * 4
    return max(5 * d * b + 6 * d * 4, (3 * d + 3 * i) * b) + rotary


def kept_bytes(spec, vision: VisionShape, b: int, fused: bool, recomputed: int, offload: bool) -> int:
    """The tower's activations alive through the decoder's step: nothing frozen; with LoRA the kept
    blocks' activations, the recomputed blocks' inputs (or two offload buffers) and the merger's."""
    p, d = patches(spec, vision), vision.width
    chosen = lora_names(spec, vision)
    if not trains_tower(spec, vision):
        return p * 4 * d * b if chosen else 0          # a LoRA'd merger on a frozen tower
    inputs = (2 if offload else recomputed) * p * d * b if recomputed else 0
    blocks = (vision.depth - recomputed) * p * block_kept_bytes(vision, b, fused)
    return inputs + blocks + p * 4 * d * b


def step_parts(spec, vision: VisionShape, b: int, fused: bool, recomputed: int, offload: bool,
               text_step: int, hidden: int) -> dict[str, int]:
    """fit.py's parts for the tower's activations. `text_step`: the decoder's activation bytes at its
    peak; the tower's own moments add only what exceeds them (module doc)."""
    p, d = patches(spec, vision), vision.width
    pixels = spec.gradient_accumulation_steps * p * vision.patch_values * PIXEL_BYTES
    parts = {"vision activations": pixels + kept_bytes(spec, vision, b, fused, recomputed, offload)}
    forward = p * (vision.patch_values * b + forward_transient_bytes(vision, b)) + spec.batch_tokens() * hidden * b
    backward = 0
    if trains_tower(spec, vision):
        backward = p * (vision.inter + 3 * d) * b + (p * block_kept_bytes(vision, b, fused) if recomputed else 0)
    excess = max(forward, backward) - text_step
    if excess > 0:
        parts["vision step transient"] = excess
    return parts


def split_recomputed(spec, vision: VisionShape | None, recomputed: int) -> tuple[int, int]:
    """(vision blocks, decoder layers) recomputed for a plan that recomputes the first `recomputed` of
    the plannable layers in forward order: a LoRA'd tower's blocks, then the decoder's layers. A frozen
    tower's blocks keep nothing whether recomputed or not, so a budget plan leaves them off."""
    first = plannable(spec, vision)
    return min(recomputed, first), recomputed - min(recomputed, first)


def plan_flags(spec, vision: VisionShape | None, layers: int, recomputed: int) -> list[bool]:
    """One flag per GradientCheckpointingLayer of the model, vision blocks first (their forward order)."""
    in_tower, in_decoder = split_recomputed(spec, vision, recomputed)
    depth = vision.depth if vision else 0
    return ([True] * in_tower + [False] * (depth - in_tower)
            + [True] * in_decoder + [False] * (layers - in_decoder))


def plannable(spec, vision: VisionShape | None) -> int:
    """The vision blocks a plan may recompute (a LoRA'd tower's), before the decoder's layers."""
    return vision.depth if trains_tower(spec, vision) else 0


def recomputed_of_flags(spec, vision: VisionShape | None, flags: list[bool]) -> int:
    """A model's (or kernels' "auto") per-layer flags, vision blocks first, as fit.py's count of the
    plannable layers recomputed (split_recomputed's inverse for prefix plans)."""
    depth = vision.depth if vision else 0
    return (sum(flags[:depth]) if plannable(spec, vision) else 0) + sum(flags[depth:])
