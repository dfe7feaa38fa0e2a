"""GPU check of the packed attention at the benchmark's shapes: kernels.ops.varlen_attention (the
FlashAttention varlen kernel) against its exact per-document reference, forward and backward, in
bf16, on rows of 4096 tokens packed from bench/job_data.py's length distribution; and its time
against sdpa with a dense block-diagonal mask (what transformers builds for packed rows).

    python bench/check_varlen.py --out /tmp/check_varlen.jsonl
    python bench/check_varlen.py --shared --out ...   # GRPO's shared prompts: keys apart from queries

`--shared` checks what GRPO's packed pass with each prompt once runs (kernels/packed_attention.py
`kv_index`): each completion's keys gathered behind its prompt's, causality aligned bottom right by the
kernel, against the reference (forward and backward, bf16), and its time beside the unshared packing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.job_data import example_lengths  # noqa: E402
from jobs.data.packing import pack  # noqa: E402
from kernels.ops import varlen_attention as op  # noqa: E402


def documents(rows: int, row_length: int) -> list[int]:
    lengths = [min(n, row_length) for n in example_lengths(4000, seed=1)]
    bins = pack(lengths, row_length, seed=0)[:rows]
    docs = []
    for b in bins:
        docs += [lengths[i] for i in b]
        if sum(lengths[i] for i in b) < row_length:
            docs.append(row_length - sum(lengths[i] for i in b))
    return docs


def rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def timed(fn, repeat: int = 10) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=3, rep=repeat)


def check(heads: int, kv_heads: int, dim: int, rows: int, window: int | None) -> dict:
    docs = documents(rows, 4096)
    total = sum(docs)
    cu = torch.tensor([0] + list(torch.tensor(docs).cumsum(0)), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(total, h, dim, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = op.varlen_attention(q, k, v, cu, max(docs), sliding_window=window)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    ref = op.varlen_attention_reference(q.float(), k.float(), v.float(), cu, dim ** -0.5, window)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), grad.float())
    fused_ms = timed(lambda: torch.autograd.grad(op.varlen_attention(q, k, v, cu, max(docs), sliding_window=window),
                                                 (q, k, v), grad))
    doc_id = torch.repeat_interleave(torch.arange(len(docs), device="cuda"), torch.tensor(docs, device="cuda"))
    mask = (doc_id[:, None] == doc_id[None, :]).tril()[None, None]
    qd, kd, vd = (t.transpose(0, 1)[None] for t in (q, k, v))
    dense = lambda: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        qd, kd, vd, attn_mask=mask, enable_gqa=True), (q, k, v), grad.transpose(0, 1)[None])
    return {"heads": heads, "kv_heads": kv_heads, "head_dim": dim, "tokens": total, "documents": len(docs),
            "window": window, "kernel": op.kernel_unavailable_reason(q) or "varlen", "torch_varlen": op._torch_varlen()[1],
            "rel_err_out": rel(out, ref), "rel_err_dq": rel(dq, rq), "rel_err_dk": rel(dk, rk), "rel_err_dv": rel(dv, rv),
            "varlen_fwd_bwd_ms": round(fused_ms, 3), "sdpa_dense_mask_fwd_bwd_ms": round(timed(dense), 3),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def vision_check(images: int = 4, heads: int = 16, dim: int = 80, window: int = 64) -> dict:
    """The bidirectional varlen call a Qwen2.5-VL-7B tower block makes (kernels/vision_attention.py):
    1024x768 images (73 x 54 patches), windows of 8 x 8 patches (the tower's windowed blocks) against
    the exact reference, and its time against transformers' loop of one sdpa call per window."""
    patches = 73 * 54
    docs = [window] * (patches // window) + [patches % window]
    docs = docs * images
    total = sum(docs)
    cu = torch.tensor([0] + list(torch.tensor(docs).cumsum(0)), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    grad = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    run = lambda: torch.autograd.grad(op.varlen_attention(q, k, v, cu, max(docs), causal=False), (q, k, v), grad)  # noqa: E731
    out = op.varlen_attention(q, k, v, cu, max(docs), causal=False)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    ref = op.varlen_attention_reference(q.float(), k.float(), v.float(), cu, dim ** -0.5, causal=False)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), grad.float())

    def per_window():   # transformers' non-flash branch: lengths to the host, split, one sdpa a piece
        lengths = (cu[1:] - cu[:-1]).tolist()
        pieces = zip(*(torch.split(t.transpose(0, 1)[None], lengths, dim=2) for t in (q, k, v)))
        outs = [torch.nn.functional.scaled_dot_product_attention(a, b, c) for a, b, c in pieces]
        return torch.autograd.grad(torch.cat(outs, dim=2), (q, k, v), grad.transpose(0, 1)[None])
    return {"vision": True, "heads": heads, "head_dim": dim, "tokens": total, "documents": len(docs),
            "rel_err_out": rel(out, ref), "rel_err_dq": rel(dq, rq), "rel_err_dk": rel(dk, rk), "rel_err_dv": rel(dv, rv),
            "varlen_fwd_bwd_ms": round(timed(run), 3), "per_window_sdpa_fwd_bwd_ms": round(timed(per_window), 3),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def padding_cost(heads: int, kv_heads: int, dim: int, rows: int) -> dict:
    """What fixed shapes (jobs/data/packing.py `fix_shapes`, for a captured step) cost the varlen kernel:
    fwd+bwd ms with the real boundaries and longest document, with the boundaries padded by empty
    documents to the plan's worst case, with max_length the row length, and both; outputs equal."""
    lengths = [min(n, 4096) for n in example_lengths(4000, seed=1)]
    bins = pack(lengths, 4096, seed=0)
    capacity = rows * max(len(b) + 1 for b in bins) + 1
    docs = documents(rows, 4096)
    total = sum(docs)
    cu = torch.tensor([0] + list(torch.tensor(docs).cumsum(0)), dtype=torch.int32, device="cuda")
    padded = torch.cat([cu, cu[-1:].repeat(capacity - len(cu))])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(total, h, dim, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)

    def run(bounds, longest):
        return torch.autograd.grad(op.varlen_attention(q, k, v, bounds, longest), (q, k, v), grad)
    exact, fixed = run(cu, max(docs)), run(padded, 4096)
    times = {name: round(timed(lambda b=b, m=m: run(b, m)), 3) for name, (b, m) in {
        "exact": (cu, max(docs)), "padded_bounds": (padded, max(docs)), "row_length_max": (cu, 4096),
        "fixed_both": (padded, 4096)}.items()}
    return {"padding_cost": True, "heads": heads, "kv_heads": kv_heads, "head_dim": dim, "rows": rows,
            "documents": len(docs), "boundaries_fixed": capacity, "longest": max(docs), "fwd_bwd_ms": times,
            "fixed_equals_exact": all(torch.equal(a, b) for a, b in zip(exact, fixed)),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def shared_check(prompts: int = 8, group: int = 8, prompt_len: int = 160, answer: int = 256,
                 heads: int = 32, kv_heads: int = 8, dim: int = 64) -> dict:
    """GRPO 1B's shape (bench/NOTES.md): the completions' attention with each prompt once against the
    reference and against the unshared packed layout (every completion behind its own prompt copy)."""
    from jobs.train.methods.grpo_data import rollout_tensors_packed, rollout_tensors_packed_shared
    gen = torch.Generator().manual_seed(0)
    texts = [torch.randint(3, 1000, (prompt_len - 7 * i,), generator=gen).tolist() for i in range(prompts)]
    answers = [torch.randint(3, 1000, (answer - 13 * (s % 5),), generator=gen).tolist()
               for s in range(prompts * group)]
    shared, ints = rollout_tensors_packed_shared(texts, answers, group)
    plain, plain_ints = rollout_tensors_packed(texts, answers, group)
    cuda = {k: v.cuda() for k, v in shared.items()}
    total = shared["input_ids"].shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(total, h, dim, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    grad = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)

    def run():
        keys, values = k.index_select(0, cuda["kv_index"]), v.index_select(0, cuda["kv_index"])
        out = op.varlen_attention(q, keys, values, cuda["cu_seq_lens_q"], ints["max_length_q"],
                                  cu_seqlens_k=cuda["cu_seq_lens_k"], max_seqlen_k=ints["max_length_k"])
        return out, torch.autograd.grad(out, (q, k, v), grad)
    out, (dq, dk, dv) = run()
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = op.varlen_attention_reference(ref_in[0], ref_in[1].index_select(0, cuda["kv_index"]),
                                        ref_in[2].index_select(0, cuda["kv_index"]), cuda["cu_seq_lens_q"],
                                        dim ** -0.5, cu_seqlens_k=cuda["cu_seq_lens_k"])
    rq, rk, rv = torch.autograd.grad(ref, ref_in, grad.float())
    n = plain["input_ids"].shape[1]
    pq, pk, pv = (torch.randn(n, h, dim, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                  for h in (heads, kv_heads, kv_heads))
    pgrad, pcu = torch.randn(n, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g), plain["cu_seq_lens_q"].cuda()
    unshared = lambda: torch.autograd.grad(op.varlen_attention(pq, pk, pv, pcu, plain_ints["max_length_q"]),  # noqa: E731
                                           (pq, pk, pv), pgrad)
    return {"shared_prompts": True, "prompts": prompts, "group": group, "prompt_len": prompt_len, "answer": answer,
            "heads": heads, "kv_heads": kv_heads, "head_dim": dim, "tokens_shared": total, "tokens_unshared": n,
            "keys_apart_reason": op.keys_apart_reason("cuda", torch.bfloat16, dim),
            "rel_err_out": rel(out, ref), "rel_err_dq": rel(dq, rq), "rel_err_dk": rel(dk, rk), "rel_err_dv": rel(dv, rv),
            "shared_fwd_bwd_ms": round(timed(lambda: run()[1]), 3), "unshared_fwd_bwd_ms": round(timed(unshared), 3),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--padding", action="store_true", help="only the fixed-shape cost (padding_cost)")
    parser.add_argument("--vision", action="store_true", help="only a vision tower's bidirectional call")
    parser.add_argument("--shared", action="store_true", help="only GRPO's shared prompts (keys apart)")
    args = parser.parse_args()
    if args.vision or args.shared:
        try:
            result = vision_check() if args.vision else shared_check()
        except Exception as exc:  # recorded: the lead sees what failed on the GPU
            result = {"vision" if args.vision else "shared_prompts": True, "error": f"{type(exc).__name__}: {exc}"[:800]}
        with open(args.out, "a") as fh:
            fh.write(json.dumps(result) + "\n")
        print(json.dumps(result), flush=True)
        return
    if args.padding:
        with open(args.out, "a") as fh:
            for heads, kv_heads, dim, rows in ((32, 8, 64, 4), (32, 8, 128, 2)):
                result = padding_cost(heads, kv_heads, dim, rows)
                fh.write(json.dumps(result) + "\n")
                print(json.dumps(result), flush=True)
        return
    with open(args.out, "a") as fh:
        for heads, kv_heads, dim, rows, window in ((32, 8, 64, 4, None), (32, 8, 128, 2, None), (32, 8, 128, 2, 1024)):
            try:
                result = check(heads, kv_heads, dim, rows, window)
            except Exception as exc:  # recorded: the lead sees what failed on the GPU
                result = {"heads": heads, "head_dim": dim, "window": window, "error": f"{type(exc).__name__}: {exc}"[:800]}
            fh.write(json.dumps(result) + "\n")
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
