"""Quantize a bf16 model's decoder linears to bitsandbytes NF4 in place (double quant, blocksize
64, bf16 compute): the BASELINES.md QLoRA config, for random-init weights built on the GPU."""
from __future__ import annotations

import torch


def quantize_linear(linear: torch.nn.Linear):
    import bitsandbytes as bnb
    q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                          device="meta")
    q.weight = bnb.nn.Params4bit(linear.weight.data.to("cpu") if linear.weight.device.type == "meta"
                                 else linear.weight.data, requires_grad=False, compress_statistics=True,
                                 quant_type="nf4", blocksize=64).to(linear.weight.device)
    if linear.bias is not None:
        q.bias = torch.nn.Parameter(linear.bias.data, requires_grad=False)
    return q


def quantize_model_nf4(model) -> int:
    """Swap every nn.Linear inside the decoder layers for a Linear4bit; returns how many."""
    swapped = 0
    for layer in model.model.layers:
        for name, module in list(layer.named_modules()):
            if isinstance(module, torch.nn.Linear):
                parent_name, _, child = name.rpartition(".")
                parent = layer.get_submodule(parent_name) if parent_name else layer
                setattr(parent, child, quantize_linear(module))
                swapped += 1
        torch.cuda.empty_cache()
    model.is_loaded_in_4bit = True
    return swapped
