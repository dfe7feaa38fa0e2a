"""Where the milliseconds of one LoRA training step go: torch.profiler over a few steps of the
BASELINES.md config, CUDA kernel time grouped into GEMM, attention, our Triton kernels, elementwise
and the rest. Writes the grouped table and the top kernels as JSON.

    python bench/profile_step.py --shape llama-3.1-8b --bs 2 --seq 2048 --stack hf --checkpointing on
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_lora import SHAPES, add_lora, build_model, setup_stack  # noqa: E402

GROUPS = [
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    ("optimizer", ("adam", "multi_tensor")),
    ("copy/cast", ("copy", "cast", "to_copy", "memcpy", "fill")),
    ("elementwise", ("elementwise", "vectorized", "reduce", "unrolled")),
]


def group_of(name: str) -> str:
    lower = name.lower()
    if not name.startswith("void ") and "::" not in name and name.endswith("_kernel"):
        return "triton(ours)"  # Triton kernels are plain function names
    for group, keys in GROUPS:
        if any(k in lower for k in keys):
            return group
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--bs", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--stack", choices=["hf", "fusetune"], default="hf")
    parser.add_argument("--checkpointing", default="on")
    parser.add_argument("--qlora", action="store_true")
    parser.add_argument("--out", default="profile.json")
    args = parser.parse_args()
    model = add_lora(build_model(args.shape, args.qlora))
    model.config.use_cache = False
    setup_stack(model, args.stack, args.checkpointing, args.bs * args.seq)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    x = torch.randint(0, SHAPES[args.shape]["vocab_size"], (args.bs, args.seq), device="cuda")

    def step():
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    # unprofiled: wall minus GPU time = idle GPU; enqueue = when the CPU had issued the whole step.
    # enqueue close to wall means the CPU (Python, launches) sets the pace, not the GPU.
    walls, enqueues = [], []
    for _ in range(3):
        tick = time.perf_counter()
        step()
        enqueues.append(time.perf_counter() - tick)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - tick)
    wall_ms, enqueue_ms = sum(walls) / 3 * 1e3, sum(enqueues) / 3 * 1e3
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    totals, kernels, launches = defaultdict(float), defaultdict(float), defaultdict(int)
    for event in prof.key_averages():
        cuda_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if event.device_type == torch.autograd.DeviceType.CUDA and cuda_us:
            totals[group_of(event.key)] += cuda_us / 2e3  # ms per step
            kernels[event.key] += cuda_us / 2e3
            launches[event.key] += event.count // 2
    table = dict(sorted(totals.items(), key=lambda kv: -kv[1]))
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:25]
    # every kernel with its launches per step: many short launches leave the GPU idle between them
    every = [[name, round(ms, 3), launches[name]] for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])]
    result = {"config": vars(args), "ms_per_step_by_group": table, "gpu_ms_per_step": sum(table.values()),
              "wall_ms_per_step": wall_ms, "enqueue_ms_per_step": enqueue_ms,
              "kernel_launches_per_step": sum(launches.values()), "top_kernels_ms": top,
              "all_kernels_ms_launches": every}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"config": vars(args), "wall_ms": round(wall_ms, 1), "enqueue_ms": round(enqueue_ms, 1),
                      "gpu_ms": round(result["gpu_ms_per_step"], 1), "launches": result["kernel_launches_per_step"],
                      "ms_per_step_by_group": {k: round(v, 1) for k, v in table.items()}}))
    for name, ms in top[:12]:
        print(f"{ms:9.2f} ms  {name[:110]}")


if __name__ == "__main__":
    main()
