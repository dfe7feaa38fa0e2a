"""Per-token log-probs of the LM head, forward + backward: Fusetune's fused_linear_logprobs vs TRL's
chunked Triton kernel (`trl.kernels.chunked_logprob.ChunkedLogProbFunction`, TRL 1.15, what its
DPO / GRPO trainers call) vs plain torch (bf16 logits -> fp32 -> log_softmax -> gather).

Shapes: Llama-3 vocabulary (V = 128256), hidden 2048 (Llama-3.2-1B) and 4096 (Llama-3.1-8B);
"dpo" = 8 pairs x (prompt + chosen + rejected) ~ 8 x 2 x 600 = 9600 tokens (prompt tokens, the first
quarter of each sequence, are ignored: label -100), "long" = 8 x 2 x 2048 = 32768 tokens. Frozen
LM head (LoRA), bf16, a random upstream gradient per token (as GRPO's per-token ratio gives);
`--train-head` makes the head trainable (our recompute path; TRL's too). TRL has no ignore_index:
its trainers pass only the label rows (`hidden_states[mask]`), and so does "trl" here;
"fusetune-compact" is our op called the same way, "fusetune" takes every row (no host sync).
Time: median of `--repeats` forward+backward runs after warm-up, CUDA events. Memory:
torch.cuda.max_memory_allocated during one run, minus what was allocated before it (the inputs).
One JSON line per (case, impl) appended to --out.

On the H200, TRL is carried as unzipped wheels (.whl/site, bench/NOTES.md "Installing peers"):
    PYTHONPATH=$PWD/.whl/site python3 bench/logprobs_op.py --out $OUT/logprobs_op.jsonl
On CPU (the test suite): `python bench/logprobs_op.py --smoke --out /tmp/x.jsonl`: tiny shapes,
our op and torch only, no TRL, one repeat; checks the script runs, measures nothing.
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels.ops.fused_linear_logprobs import (fused_linear_logprobs,  # noqa: E402
                                               fused_linear_logprobs_reference)

GIB = 1024 ** 3
VOCAB = 128256
CASES = {  # name -> (tokens, hidden)
    "dpo-1b": (8 * 2 * 600, 2048), "dpo-8b": (8 * 2 * 600, 4096),
    "long-1b": (8 * 2 * 2048, 2048), "long-8b": (8 * 2 * 2048, 4096),
}
SMOKE_CASES = {"smoke": (45, 33)}
SMOKE_VOCAB = 517


def _trl_function():
    """TRL's autograd Function, under the names its releases used (1.13: trainer.utils)."""
    try:
        from trl.kernels import chunked_logprob as module
    except ImportError:
        from trl.trainer import utils as module
    for name in ("ChunkedLogProbFunction", "_ChunkedLogProbFunction"):
        if hasattr(module, name):
            return getattr(module, name)
    raise ImportError("no chunked log-prob Function in this TRL")


def trl_logprobs():
    """(hidden, weight, labels) -> logp [N] through TRL's Function, its arguments matched by name
    (the positional order changed between releases: chunk_size came and went). chunk_size is the
    vocabulary tile its trainers pass (`_CHUNKED_LOGPROB_CHUNK_SIZE`, 32768 in 1.15); `outputs=()`
    asks for the log-probs alone (its DPO trainer also asks for entropy, mean logits, top-1)."""
    function = _trl_function()
    params = list(inspect.signature(function.forward).parameters.values())[1:]   # after ctx
    fixed = {"bias": None, "temperature": 1.0, "chunk_size": 32768, "final_logit_softcapping": None,
             "logit_scale": 1.0, "outputs": ()}

    def run(hidden, weight, labels):
        given = {params[0].name: hidden, "weight": weight, "targets": labels, "labels": labels, **fixed}
        return function.apply(*(given.get(p.name, p.default) for p in params))[0]
    return run


def _compacted(fn):
    """As TRL's trainers call it (`hidden_states[mask]`): only the label rows go through the head
    (a boolean index: one host sync); the log-probs are scattered back, 0 elsewhere."""
    def run(hidden, weight, labels):
        mask = labels != -100
        return hidden.new_zeros(labels.shape, dtype=torch.float32).masked_scatter(
            mask, fn(hidden[mask], weight, labels[mask]).float())
    return run


IMPLS = ("torch", "fusetune", "fusetune-compact", "trl")


def _impls(names):
    makers = {"torch": lambda: fused_linear_logprobs_reference, "fusetune": lambda: fused_linear_logprobs,
              "fusetune-compact": lambda: _compacted(fused_linear_logprobs),
              "trl": lambda: _compacted(trl_logprobs())}
    # torch first: its log-probs and dH are what the others are checked against
    return {name: makers[name]() for name in sorted(names, key=lambda n: n != "torch")}


def _inputs(tokens, hidden_size, vocab, device, train_head, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hidden = torch.randn(tokens, hidden_size, generator=gen).to(device, dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, generator=gen) * hidden_size ** -0.5).to(device, dtype)
    weight.requires_grad_(train_head)
    labels = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
    position = torch.arange(tokens, device=device) % max(1, tokens // 16)   # 16 sequences
    labels[position < max(1, tokens // 64)] = -100                         # first quarter: prompt
    upstream = torch.randn(tokens, generator=gen).to(device) * (labels != -100)
    return hidden, weight, labels, upstream


def _step(fn, impl, hidden, weight, labels, upstream):
    hidden.grad = weight.grad = None
    logp = fn(hidden, weight, labels)
    (logp * upstream).sum().backward()
    return logp.detach(), hidden.grad


def _timed(fn, impl, args, repeats, device):
    if device.type != "cuda":
        start = time.perf_counter()
        _step(fn, impl, *args)
        return [1e3 * (time.perf_counter() - start)]
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        _step(fn, impl, *args)
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    return times


def _peak_gib(fn, impl, args, device):
    if device.type != "cuda":
        return None
    args[0].grad = args[1].grad = None   # the previous run's dH must not hide in the base
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _step(fn, impl, *args)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / GIB


def run_case(name, tokens, hidden_size, vocab, impl, fn, args_ns, device, reference):
    args = _inputs(tokens, hidden_size, vocab, device, args_ns.train_head)
    row = {"case": name, "impl": impl, "config": {"tokens": tokens, "hidden": hidden_size, "vocab": vocab,
           "dtype": str(args[0].dtype).replace("torch.", ""), "train_head": args_ns.train_head}}
    try:
        for _ in range(0 if args_ns.smoke else 3):
            _step(fn, impl, *args)
        times = _timed(fn, impl, args, args_ns.repeats, device)
        row.update(ms=statistics.median(times), ms_all=[round(t, 3) for t in times],
                   peak_gib=_peak_gib(fn, impl, args, device))
        logp, grad = _step(fn, impl, *args)
        keep = args[2] != -100
        if reference is not None:
            ref_logp, ref_grad = reference
            row["max_abs_diff_vs_torch"] = (logp[keep].float() - ref_logp[keep]).abs().max().item()
            row["dh_rel_diff_vs_torch"] = ((grad.float() - ref_grad).abs().max()
                                           / ref_grad.abs().max()).item()
        return row, (logp.float(), grad.float())
    except torch.OutOfMemoryError:
        row.update(ms=None, peak_gib=None, error="out of memory")
        return row, None
    finally:
        del args
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _versions():
    import triton
    out = {"torch": torch.__version__, "triton": triton.__version__}
    try:
        import trl
        out["trl"] = trl.__version__
    except ImportError:
        out["trl"] = None
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/logprobs_op.jsonl")
    parser.add_argument("--cases", nargs="*", default=None, help=f"of {sorted(CASES)}")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--train-head", action="store_true", help="trainable LM head (recompute path)")
    parser.add_argument("--impls", nargs="*", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, torch and ours only")
    ns = parser.parse_args(argv)
    device = torch.device("cpu" if ns.smoke or not torch.cuda.is_available() else "cuda")
    cases = SMOKE_CASES if ns.smoke else {k: CASES[k] for k in (ns.cases or CASES)}
    vocab = SMOKE_VOCAB if ns.smoke else VOCAB
    common = {"gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "versions": _versions(), "date": time.strftime("%Y-%m-%d")}
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    with open(ns.out, "a") as out:
        for name, (tokens, hidden_size) in cases.items():
            reference = None
            for impl, fn in _impls([i for i in ns.impls if not (ns.smoke and i == "trl")]).items():
                row, logp = run_case(name, tokens, hidden_size, vocab, impl, fn, ns, device, reference)
                if impl == "torch":
                    reference = logp
                row = {**common, **row}
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
