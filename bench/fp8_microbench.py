"""FP8 vs bf16 base GEMMs at the Llama-3.1-8B (M = 4096) and Llama-3.2-1B (M = 8192) shapes of a
LoRA step, forward (Y = X W^T) and backward (dX = dY W), each piece timed on its own:

    bf16     torch.mm (what the engine runs today)
    quant    per-row FP8 quantization of the GEMM's activation operand (Triton)
    transp   transposing the FP8 weight codes for backward (Triton; torch copy_ for comparison)
    gemm     torch._scaled_mm row-wise, fast accumulation on / off
    fp8      quant + (transp) + gemm: what one FP8 product costs end to end

Forward projections of one node run as separate GEMMs that share one quantized X; backward runs
one GEMM per node over the concatenated K (dQ dK dV: K = q + 2 kv; d gate d up: K = 2 I), as in
kernels/ops/_lora_common.py. One JSON line per (model, projection, direction) to --out, with
TFLOP/s of the GEMM alone and of the whole FP8 product.

    python bench/fp8_microbench.py --out bench/results/fp8_microbench.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BF16 = torch.bfloat16
# model -> (tokens M, hidden, kv width, intermediate)
MODELS = {"llama-3.1-8b": (4096, 4096, 1024, 14336), "llama-3.2-1b": (8192, 2048, 512, 8192)}


def nodes(hidden: int, kv: int, inter: int):
    """(node, [(out, in) of each projection]) in the order a decoder layer runs them."""
    return [("qkv", [(hidden, hidden), (kv, hidden), (kv, hidden)]), ("o", [(hidden, hidden)]),
            ("gate_up", [(inter, hidden), (inter, hidden)]), ("down", [(hidden, inter)])]


def timer(fn, smoke: bool) -> float:
    if smoke:
        fn()
        return 0.0
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def forward_row(model, node, shapes, m, dev, smoke):
    from kernels.ops import fp8_linear as fl
    from kernels.ops.fp8_quant import quantize_rows
    x = torch.randn(m, shapes[0][1], device=dev, dtype=BF16)
    ws = [(torch.randn(o, i, device=dev) * 0.02).to(BF16) for o, i in shapes]
    q = [fl.quantize_weight(w) for w in ws]
    flops = sum(2 * m * o * i for o, i in shapes)
    xq = quantize_rows(x)
    row = {"model": model, "node": node, "direction": "forward", "M": m, "shapes": shapes, "gflop": flops / 1e9,
           "ms_bf16": timer(lambda: [x @ w.t() for w in ws], smoke),
           "ms_quant": timer(lambda: quantize_rows(x), smoke)}
    for fast in (True, False):
        fl.FAST_ACCUM_FORWARD = fast
        row[f"ms_gemm_fast{int(fast)}"] = timer(lambda: [fl.fp8_project(xq, w, None, BF16) for w in q], smoke)
    fl.FAST_ACCUM_FORWARD = True
    row["ms_fp8"] = timer(lambda: [fl.fp8_project(quantize_rows(x), w, None, BF16) for w in q], smoke)
    return _rates(row, flops, "ms_gemm_fast1")


def backward_row(model, node, shapes, m, dev, smoke):
    from kernels.ops import fp8_linear as fl
    from kernels.ops import fp8_transpose as ft
    from kernels.ops.fp8_quant import quantize_rows
    ws = [(torch.randn(o, i, device=dev) * 0.02).to(BF16) for o, i in shapes]
    q = [fl.quantize_weight(w) for w in ws]
    dys = [torch.randn(m, o, device=dev, dtype=BF16) for o, _ in shapes]
    flops = sum(2 * m * o * i for o, i in shapes)
    col = torch.cat([w.scale for w in q])

    def bf16():
        dx = dys[0] @ ws[0]
        for dy, w in zip(dys[1:], ws[1:]):
            dx.addmm_(dy, w)
    codes, scale = quantize_rows(dys, col)
    codes_t = ft.transpose_codes([w.codes for w in q])
    ones = torch.ones(1, codes_t.shape[0], device=dev)
    row = {"model": model, "node": node, "direction": "backward", "M": m, "shapes": shapes, "gflop": flops / 1e9,
           "ms_bf16": timer(bf16, smoke), "ms_quant": timer(lambda: quantize_rows(dys, col), smoke)}
    for backend in ("triton", "torch"):
        ft.BACKEND = backend
        row[f"ms_transp_{backend}"] = timer(lambda: ft.transpose_codes([w.codes for w in q]), smoke)
    ft.BACKEND = "triton"
    for fast in (True, False):
        row[f"ms_gemm_fast{int(fast)}"] = timer(
            lambda: fl.scaled_mm(codes, scale, codes_t.t(), ones, BF16, None, fast), smoke)
    row["ms_fp8"] = timer(lambda: fl.fp8_grad_input(dys, q, BF16), smoke)
    return _rates(row, flops, "ms_gemm_fast0")


def _rates(row, flops, gemm_key):
    for key in ("ms_bf16", gemm_key, "ms_fp8"):
        if row[key]:
            row[f"tflops_{key[3:]}"] = round(flops / row[key] / 1e9, 1)
    if row["ms_fp8"]:
        row["speedup_fp8_vs_bf16"] = round(row["ms_bf16"] / row["ms_fp8"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="fp8_microbench.jsonl")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (TRITON_INTERPRET=1), no timing")
    args = parser.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    models = {"tiny": (48, 64, 16, 96)} if args.smoke else MODELS
    meta = {"gpu": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with open(args.out, "a", buffering=1) as fh:
        for model, (m, hidden, kv, inter) in models.items():
            for node, shapes in nodes(hidden, kv, inter):
                for fn in (forward_row, backward_row):
                    row = {**fn(model, node, shapes, m, dev, args.smoke), **meta}
                    fh.write(json.dumps(row) + "\n")
                    keys = ("model", "node", "direction", "ms_bf16", "ms_quant", "ms_gemm_fast1", "ms_gemm_fast0",
                            "ms_transp_triton", "ms_transp_torch", "ms_fp8", "tflops_bf16", "tflops_fp8",
                            "speedup_fp8_vs_bf16")
                    print(json.dumps({k: row[k] for k in keys if k in row}), flush=True)
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
