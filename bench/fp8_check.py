"""FP8 cases for bench/gpu_check.py: the FP8 kernels and the FP8 LoRA ops on the GPU at the real
Llama shapes, against bf16 and against the PyTorch emulation of the same quantization.

Each case returns one gpu_check row: `errors` (relative Frobenius errors) and timings (ms, median
of triton.testing.do_bench). Reading the errors:
  * vs_emulation: the same codes multiplied in fp32 (kernels.ops.fp8_linear.fp8_group_reference);
    should be ~1e-3 (accumulation order, fast accumulation, one bf16 rounding);
  * vs_bf16: the unquantized product; ~2-4 % is what e4m3's 3-bit mantissa costs, per GEMM.
"""
from __future__ import annotations

import torch

BF16 = torch.bfloat16


# set by fp8_cases(): gpu_check runs as __main__, so its globals cannot be imported from here
_ENV: dict = {}


def _env():
    return _ENV["dev"], _ENV["small"], _ENV["rel"], _ENV["ms"]


def quant_case():
    """Triton row quantization vs torch's own cast, bit for bit, and its speed against torch."""
    from kernels.ops.fp8_quant import quantize_rows, quantize_rows_reference
    dev, small, rel, ms = _env()
    m, k = (37, 333) if small else (4096, 14336)
    x = torch.randn(m, k, device=dev, dtype=BF16) * torch.rand(m, 1, device=dev, dtype=BF16) * 5
    col = torch.rand(k, device=dev) + 0.5
    codes, scale = quantize_rows(x, col)
    ref_codes, ref_scale = quantize_rows_reference(x, col)
    same = torch.equal(codes.view(torch.uint8), ref_codes.view(torch.uint8))
    return {"op": "fp8_quantize_rows", "shape": [m, k],
            "errors": {"bit_exact_codes": bool(same), "scale_rel": rel(scale, ref_scale)},
            "ms_ours": ms(lambda: quantize_rows(x, col)), "ms_torch": ms(lambda: quantize_rows_reference(x, col))}


def transpose_case():
    from kernels.ops import fp8_transpose as ft
    dev, small, _, ms = _env()
    shapes = [(96, 64), (32, 64)] if small else [(14336, 4096), (14336, 4096)]
    weights = [torch.randint(0, 255, s, device=dev, dtype=torch.uint8).view(torch.float8_e4m3fn) for s in shapes]
    same = torch.equal(ft.transpose_codes(weights).view(torch.uint8),
                       ft.transpose_codes_reference(weights).view(torch.uint8))
    timings = {}
    for backend in ("triton", "torch"):
        ft.BACKEND = backend
        timings[backend] = ms(lambda: ft.transpose_codes(weights))
    ft.BACKEND = "triton"
    return {"op": "fp8_transpose[gate|up]", "errors": {"bit_exact": bool(same)},
            "ms_ours": timings["triton"], "ms_torch": timings["torch"]}


def _fp8_projection(out_f, in_f, dev):
    from kernels.ops._lora_common import LoraProjection
    from kernels.ops.fp8_linear import quantize_weight
    w = torch.randn(out_f, in_f, device=dev) * 0.02
    a = (torch.randn(16, in_f, device=dev) * 0.02).requires_grad_()
    b = (torch.randn(out_f, 16, device=dev) * 0.02).requires_grad_()
    return LoraProjection(w.to(BF16), a, b, 1.0), LoraProjection(quantize_weight(w.to(BF16)), a, b, 1.0)


def _fwd_bwd(fn, x, projections):
    x = x.detach().requires_grad_()
    outs = fn(x, *projections)
    outs = outs if isinstance(outs, tuple) else (outs,)
    seeds = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, seeds)
    return [o.detach().float() for o in outs], x.grad.float()


def lora_fp8_case(name: str):
    """One fused LoRA op with FP8 bases vs the same op with bf16 bases (8B shapes, M = 4096)."""
    from kernels.ops import lora_mlp, lora_o, lora_qkv
    dev, small, rel, ms = _env()
    tokens, hidden, inter = (37, 64, 96) if small else (4096, 4096, 14336)
    kv = hidden // 4
    shapes = {"lora_qkv": [(hidden, hidden), (kv, hidden), (kv, hidden)], "lora_o": [(hidden, hidden)],
              "lora_mlp": [(inter, hidden), (inter, hidden), (hidden, inter)]}[name]
    fn = {"lora_qkv": lora_qkv.lora_qkv, "lora_mlp": lora_mlp.lora_mlp,
          "lora_o": lambda x_, p: lora_o.lora_o(x_, *p)}[name]
    pairs = [_fp8_projection(o, i, dev) for o, i in shapes]
    bf16, fp8 = [p[0] for p in pairs], [p[1] for p in pairs]
    x = torch.randn(tokens, hidden, device=dev, dtype=BF16)
    torch.manual_seed(1)
    outs_ref, dx_ref = _fwd_bwd(fn, x, bf16)
    torch.manual_seed(1)
    outs, dx = _fwd_bwd(fn, x, fp8)
    errors = {f"out{i}_vs_bf16": rel(o, r) for i, (o, r) in enumerate(zip(outs, outs_ref))}
    errors["dx_vs_bf16"] = rel(dx, dx_ref)

    def step(projections):
        xx = x.detach().requires_grad_()
        o = fn(xx, *projections)
        torch.autograd.backward(list(o) if isinstance(o, tuple) else [o],
                                [torch.ones_like(t) for t in (o if isinstance(o, tuple) else (o,))])
    return {"op": f"{name}[fp8 base]", "errors": errors, "ms_ours": ms(lambda: step(fp8)),
            "ms_bf16_base": ms(lambda: step(bf16))}


def linear_case():
    """fp8_linear vs its fp32 emulation (same codes) and vs the bf16 product, forward and dX."""
    from kernels.ops.fp8_linear import fp8_linear, fp8_linear_reference, quantize_weight
    dev, small, rel, ms = _env()
    m, k, n = (48, 64, 80) if small else (4096, 4096, 14336)
    w = (torch.randn(n, k, device=dev) * 0.02).to(BF16)
    weight = quantize_weight(w)
    x = torch.randn(m, k, device=dev, dtype=BF16)
    seed = torch.randn(m, n, device=dev, dtype=BF16)
    results = {}
    for label, fn in (("fp8", lambda t: fp8_linear(t, weight)), ("emulated", lambda t: fp8_linear_reference(t, weight)),
                      ("bf16", lambda t: t @ w.t())):
        xx = x.clone().requires_grad_()
        y = fn(xx)
        y.backward(seed)
        results[label] = (y.float(), xx.grad.float())
    errors = {"y_vs_emulation": rel(results["fp8"][0], results["emulated"][0]),
              "dx_vs_emulation": rel(results["fp8"][1], results["emulated"][1]),
              "y_vs_bf16": rel(results["fp8"][0], results["bf16"][0]),
              "dx_vs_bf16": rel(results["fp8"][1], results["bf16"][1])}
    xx = x.clone().requires_grad_()
    return {"op": "fp8_linear[4096x4096->14336]", "errors": errors,
            "ms_ours": ms(lambda: fp8_linear(xx, weight).backward(seed)),
            "ms_torch_bf16": ms(lambda: (xx @ w.t()).backward(seed))}


def model_case():
    """A small Llama with LoRA, patched: FP8 bases vs bf16 bases, first-step loss and LoRA grads."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM
    from kernels import patch_model
    dev, small, rel, _ = _env()
    hidden, layers, vocab, seq = (64, 2, 128, 17) if small else (1024, 4, 32000, 1024)
    config = AutoConfig.for_model("llama", hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                                  num_attention_heads=8 if not small else 4, num_key_value_heads=2, vocab_size=vocab)
    x = torch.randint(0, vocab, (2, seq), device=dev)
    results = []
    for precision in ("bf16", "fp8"):
        torch.manual_seed(0)
        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(config, dtype=BF16 if dev == "cuda" else torch.float32)
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules="all-linear"))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        report = patch_model(model, backend="triton", base_precision=precision).lines()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        results.append((float(loss), {n: p.grad.float() for n, p in model.named_parameters() if p.requires_grad},
                        report))
    (l0, g0, _), (l1, g1, report) = results
    return {"op": "model[llama fp8 vs bf16]", "errors": {"loss_rel": abs(l1 - l0) / abs(l0),
            "median_grad_rel": float(torch.tensor([rel(g1[n], g0[n]) for n in g0]).median())},
            "report": report}


def fp8_cases(dev: str, small: bool, rel, ms):
    """(name, case) pairs for gpu_check; dev/small/rel/ms are gpu_check's settings and helpers."""
    _ENV.update(dev=dev, small=small, rel=rel, ms=ms)
    yield "fp8_quantize_rows", quant_case
    yield "fp8_transpose", transpose_case
    yield "fp8_linear", linear_case
    for name in ("lora_qkv", "lora_o", "lora_mlp"):
        yield f"{name}[fp8 base]", lambda name=name: lora_fp8_case(name)
    yield "model[llama fp8 vs bf16]", model_case
