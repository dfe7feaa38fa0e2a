"""Random-init NF4 models for the QLoRA rows of BASELINES.md (bitsandbytes NF4, double quant,
blocksize 64, bf16 compute), built layer by layer on the GPU so that even a 70B shape never holds
its bf16 weights at once: each decoder layer is materialised in bf16, initialised, quantised, and
its bf16 copy freed before the next."""
from __future__ import annotations

import torch

INIT_STD = 0.02


def quantize_linear(linear: torch.nn.Linear):
    import bitsandbytes as bnb
    q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                          device="meta")
    q.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False, compress_statistics=True,
                                 quant_type="nf4", blocksize=64).to(linear.weight.device)
    if linear.bias is not None:
        q.bias = torch.nn.Parameter(linear.bias.data, requires_grad=False)
    return q


def _init_(module: torch.nn.Module) -> None:
    """Materialise a meta module on the GPU with the usual Llama-style random init."""
    module.to_empty(device="cuda")
    for name, param in module.named_parameters():
        with torch.no_grad():
            if "norm" in name:
                param.fill_(0.0 if param.dim() == 1 and _zero_centred(module) else 1.0)
            else:
                param.normal_(0.0, INIT_STD)


def _zero_centred(module) -> bool:
    return "Gemma" in type(module).__name__


def _quantize_layer(layer: torch.nn.Module) -> int:
    swapped = 0
    for name, module in list(layer.named_modules()):
        if isinstance(module, torch.nn.Linear):
            parent_name, _, child = name.rpartition(".")
            parent = layer.get_submodule(parent_name) if parent_name else layer
            setattr(parent, child, quantize_linear(module))
            swapped += 1
    return swapped


def build_nf4_model(config):
    """An AutoModelForCausalLM of `config` with NF4 decoder linears and bf16 everything else."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    for layer in model.model.layers:
        _init_(layer)
        _quantize_layer(layer)
        torch.cuda.empty_cache()
    for module in (model.model.embed_tokens, model.model.norm):
        _init_(module)
    if not config.tie_word_embeddings:
        _init_(model.lm_head)
    else:
        model.tie_weights()
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=config, device="cuda")
    model.is_loaded_in_4bit = True
    return model
