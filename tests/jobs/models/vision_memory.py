"""Measuring a vision tower's memory on CPU, for the fit check's vision tests: the bytes autograd saves
for backward (saved-tensor hooks) and the peak of live tensors during a forward (a dispatch mode that
watches every storage the ops create). Parameters, buffers and the input pixels are not counted."""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})


def vl_config(family: str, width: int, inter: int, depth: int, heads: int = 2):
    """An image-text config with a small decoder and a vision tower of the given widths."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig
    common = dict(depth=depth, num_heads=heads, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    if family == "qwen2_5_vl":
        vision = dict(common, hidden_size=width, intermediate_size=inter, out_hidden_size=64, window_size=112,
                      fullatt_block_indexes=[depth - 1])
        return Qwen2_5_VLConfig(text_config=TEXT, vision_config=vision, image_token_id=500, video_token_id=501)
    vision = dict(common, embed_dim=width, mlp_ratio=inter // width, hidden_size=64)   # an int in 5.24
    return Qwen2VLConfig(text_config=TEXT, vision_config=vision, image_token_id=500, video_token_id=501)


def lora_model(config, vision_lora: bool, fused: bool = False):
    """The model with Fusetune's LoRA (jobs/models/load.py: r 2 on every linear of the language model,
    and of the tower and merger with vision_lora), optionally patched with the fused engine."""
    from transformers import AutoModelForImageTextToText

    from jobs.models import load
    from jobs.spec import JobSpec
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = load.add_lora(AutoModelForImageTextToText.from_config(config),
                          JobSpec(model="x", lora_r=2, lora_alpha=2, vision_lora=vision_lora))
    if fused:
        from kernels import patch_model
        patch_model(model, backend="triton")
    return model.train()


def _tower_and_input(model, grid: tuple[int, int, int]):
    visual = model.get_base_model().model.visual
    embed = visual.patch_embed
    values = embed.in_channels * embed.temporal_patch_size * embed.patch_size ** 2
    pixels = torch.randn(grid[0] * grid[1] * grid[2], values)
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), pixels]}
    return visual, pixels, torch.tensor([grid]), skip


def saved_for_backward(model, grid: tuple[int, int, int]) -> int:
    """Bytes of the distinct storages the tower's forward saves for backward."""
    visual, pixels, grid_thw, skip = _tower_and_input(model, grid)
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        visual(pixels, grid_thw=grid_thw)
    return sum(saved.values())


class _LivePeak(TorchDispatchMode):
    def __init__(self, skip: set[int]):
        super().__init__()
        self.skip, self.live, self.peak = skip, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                known = self.live.get(storage.data_ptr())
                if storage.data_ptr() not in self.skip and (known is None or known[0].expired()):
                    self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        self.live = {ptr: entry for ptr, entry in self.live.items() if not entry[0].expired()}
        self.peak = max(self.peak, sum(size for _, size in self.live.values()))
        return out


def forward_peak(model, grid: tuple[int, int, int]) -> int:
    """The most bytes of tensors alive at once during the tower's forward."""
    visual, pixels, grid_thw, skip = _tower_and_input(model, grid)
    with _LivePeak(skip) as mode:
        visual(pixels, grid_thw=grid_thw)
    return mode.peak
