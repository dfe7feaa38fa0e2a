"""GPU A/B of how kernels.ops.varlen_attention reaches FlashAttention's varlen kernel: directly through
`aten._flash_attention_forward`/`_backward` from our autograd.Function, or through torch's
`varlen_attn` custom op (kernels/ops/varlen_attention.py, "Dispatch"). Same kernel, so the outputs and
gradients must be equal bit for bit; what differs is host time, measured on inputs small enough that
the host, not the GPU, sets the pace (a 1B step calls attention 58 times, bench/NOTES.md).

    python bench/check_varlen_dispatch.py --out /tmp/varlen_dispatch.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.ops import varlen_attention as op  # noqa: E402

CASES = {   # name: (q heads, kv heads, head dim, documents' lengths, sliding window, causal)
    "gqa_causal_1b": (32, 8, 64, (700, 1200, 96, 2100), None, True),
    "gqa_window": (16, 4, 128, (300, 1024, 77), 256, True),
    "bidirectional_vision": (16, 16, 80, (64,) * 12 + (37,), None, False),
    "tiny_host_bound": (32, 8, 64, (40, 23, 61), None, True),
}


def inputs(heads: int, kv_heads: int, dim: int, docs: tuple):
    gen = torch.Generator(device="cuda").manual_seed(0)
    total = sum(docs)
    q, k, v = (torch.randn(total, h, dim, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, grad, cu


def via(direct: bool, run):
    """Run `run` with the direct path on or off (the module's switch), restoring it afterwards."""
    before = dict(op._direct)
    op._direct.update(on=direct)
    try:
        return run()
    finally:
        op._direct.update(before)


def host_us(run, calls: int = 300) -> float:
    """Microseconds a call, wall clock over `calls` calls with one sync at the end."""
    for _ in range(20):
        run()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / calls * 1e6


def case(name: str) -> dict:
    heads, kv_heads, dim, docs, window, causal = CASES[name]
    q, k, v, grad, cu = inputs(heads, kv_heads, dim, docs)

    def fwd_bwd():
        out = op.varlen_attention(q, k, v, cu, max(docs), sliding_window=window, causal=causal)
        return (out, *torch.autograd.grad(out, (q, k, v), grad))
    direct, public, again = via(True, fwd_bwd), via(False, fwd_bwd), via(True, fwd_bwd)
    return {"case": name, "heads": heads, "kv_heads": kv_heads, "head_dim": dim, "documents": list(docs),
            "window": window, "causal": causal, "direct_off_reason": op.direct_off_reason(),
            "bitwise_equal": [torch.equal(a, b) for a, b in zip(direct, public)],
            # FlashAttention-2 adds dq up with atomics across key blocks: run to run, not bitwise
            "direct_twice_bitwise_equal": [torch.equal(a, b) for a, b in zip(direct, again)],
            "direct_fwd_bwd_us": round(via(True, lambda: host_us(fwd_bwd)), 1),
            "varlen_attn_fwd_bwd_us": round(via(False, lambda: host_us(fwd_bwd)), 1),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with open(args.out, "a") as fh:
        for name in CASES:
            try:
                result = case(name)
            except Exception as exc:  # recorded: the lead sees what failed on the GPU
                result = {"case": name, "error": f"{type(exc).__name__}: {exc}"[:800], "torch": torch.__version__}
            fh.write(json.dumps(result) + "\n")
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
