"""Is the FP8 step waiting on the host? (issue 11: the 8B no-recompute row's GPU is busy ~170 ms of
a ~200 ms step.)

For bf16 and then FP8 bases on one model (bench_lora's harness: random weights, LoRA r16 on all
linear layers, no recompute), time each step twice: `enqueue_ms`, how long the host takes to queue
forward, backward and the optimizer step (no sync inside), and `step_ms`, until the GPU has run it.
enqueue close to step means the launches, not the GPU, set the pace.

    python bench/fp8_host.py --shape llama-3.1-8b --bs 2 --seq 2048 --out fp8_host.jsonl
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_lora import (SHAPES, _version, _write, add_lora, add_shape_args, build_model, make_batches,  # noqa: E402
                              timed_steps)


def time_steps(model, batches, steps: int, warmup: int) -> dict:
    """Medians of bench_lora.timed_steps' per-step enqueue and wall times (after the warm-ups)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    timed = timed_steps(model, batches, opt, warmup, steps)
    return {"enqueue_ms": round(statistics.median(timed["enqueue_s_all"][warmup:]) * 1e3, 1),
            "step_ms": round(statistics.median(timed["step_s_all"][warmup:]) * 1e3, 1),
            "gc_pause_ms": timed["gc_pause_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(parser)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--save-model", default=None, help="also save the bf16 base here (for bench/unsloth_rows.py)")
    parser.add_argument("--out", default="fp8_host.jsonl")
    args = parser.parse_args()
    from kernels import patch_model
    base = build_model(args.shape, False)
    if args.save_model:
        from bench.bench_fp8 import save_base
        save_base(base, Path(args.save_model), SHAPES[args.shape]["vocab_size"])
    model = add_lora(base)
    model.config.use_cache = False
    batches = make_batches(args.shape, args.bs, args.seq)
    for precision in ("bf16", "fp8"):   # bf16 first: FP8 quantization frees the bf16 weights
        patch_model(model, backend="triton", base_precision=precision)
        row = {"bench": "fp8_host", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "triton": _version("triton"), "transformers": _version("transformers"), "peft": _version("peft"),
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "shape": args.shape, "bs": args.bs, "seq": args.seq, "precision": precision,
               "checkpointing": "off", **time_steps(model, batches, args.steps, args.warmup)}
        row["tokens_per_s"] = round(args.bs * args.seq / row["step_ms"] * 1e3, 1)
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
        print(row, flush=True)
        _write(args.out, row)


if __name__ == "__main__":
    main()
