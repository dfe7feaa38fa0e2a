"""Where the host's time goes while it queues one training step (issue 11: on the 8B no-recompute row
the FP8 step is host-bound; bench_lora's enqueue_s_all shows the host queueing for 160-225 ms of a
184-230 ms step, while the GPU needs ~170 ms).

For bf16 and then FP8 bases on one model (BASELINES.md's config, no recompute): the time the host
takes to queue forward, backward and the optimizer step separately, then one step under
torch.profiler with Python stacks: CPU time by aten op (self, with counts), by Python function
(self time; inclusive for our kernels/, PEFT, the transformers model and the optimizer), and the
number of kernel launches.

    python bench/host_profile.py --shape llama-3.1-8b --bs 2 --seq 2048 --out host_profile.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_lora import add_lora, add_shape_args, build_model, make_batches  # noqa: E402

OWNERS = ("kernels/", "peft/", "transformers/models/", "torch/optim/")   # whose functions to rank inclusively
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def phase_times(model, batches, opt, steps: int) -> dict:
    """Median ms the host takes to queue each phase (no sync inside a step), and the whole step."""
    phases = defaultdict(list)
    for i in range(steps):
        x = batches[i % len(batches)]
        torch.cuda.synchronize()
        tick = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        queued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        for name, value in (("forward", forward - tick), ("backward", backward - forward),
                            ("optimizer", queued - backward), ("enqueue", queued - tick), ("step", done - tick)):
            phases[name].append(value * 1e3)
    return {f"{name}_ms": round(statistics.median(values), 1) for name, values in phases.items()}


def _is_python(name: str) -> bool:
    return ".py(" in name


def profiled_step(model, batches, opt, top: int) -> dict:
    """One step under the profiler: aten ops by self CPU ms, Python functions by inclusive ms."""
    from torch.profiler import ProfilerActivity, profile
    x = batches[0]
    for with_stack in (True, True, False):   # the Python tracer's event names sometimes fail to decode
        torch.cuda.synchronize()
        try:
            with profile(activities=[ProfilerActivity.CPU], with_stack=with_stack) as prof:
                model(input_ids=x, labels=x).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
            events = prof.events()
            break
        except UnicodeDecodeError as error:
            print(f"profiler failed ({error}); again", flush=True)
    ops, python, launches = defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0.0, 0]), 0
    for event in events:
        name = event.name
        if name in LAUNCHES:
            launches += 1
        if _is_python(name):
            row = python[name]
            row[0] += event.cpu_time_total / 1e3
            row[1] += event.self_cpu_time_total / 1e3
            row[2] += 1
        else:
            ops[name][0] += event.self_cpu_time_total / 1e3
            ops[name][1] += 1
    ours = {name: row for name, row in python.items() if any(key in name for key in OWNERS)}

    def ranked(table, column):
        rows = sorted(table.items(), key=lambda kv: -kv[1][column])[:top]
        return [[name[:140], *[round(v, 2) if isinstance(v, float) else v for v in values]] for name, values in rows]
    return {"with_stack": with_stack, "kernel_launches": launches, "aten_self_ms_count": ranked(ops, 0),
            "python_self_ms": ranked(python, 1), "python_inclusive_self_count_ours": ranked(ours, 0)}


def python_profile(model, batches, opt, steps: int, top: int) -> dict:
    """cProfile over `steps` whole steps queued back to back (no sync inside): Python functions by
    own time and by inclusive time, per call in microseconds (cProfile inflates every call alike,
    so read the ranking, not the absolute numbers)."""
    import cProfile
    import pstats
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(steps):
        x = batches[i % len(batches)]
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler).stats   # {(file, line, name): (calls, prim, tottime, cumtime, callers)}

    def ranked(column):
        rows = sorted(stats.items(), key=lambda kv: -kv[1][column])[:top]
        return [[f"{Path(f).name}:{line}:{name}"[:120], calls // steps, round(1e3 * v[2] / steps, 2),
                 round(1e3 * v[3] / steps, 2), round(1e6 * v[column] / max(calls, 1), 1)]
                for (f, line, name), v in rows for calls in [v[0]]]
    return {"columns": ["function", "calls/step", "own ms/step", "inclusive ms/step", "us/call (ranked col)"],
            "by_own": ranked(2), "by_inclusive": ranked(3)}


def launch_costs(calls: int = 300) -> dict:
    """Host microseconds per call of single launches on tiny tensors (the GPU keeps up, so this is
    the host's cost alone): a torch op, torch._scaled_mm, and our Triton launchers."""
    from kernels.ops.fp8_linear import scaled_mm
    from kernels.ops.fp8_quant import quantize_rows
    from kernels.ops.lora_add import lora_add_
    from kernels.ops.rms_norm import rms_norm
    dev = torch.device("cuda")
    x, w = torch.randn(64, 256, device=dev, dtype=torch.bfloat16), torch.ones(256, device=dev, dtype=torch.bfloat16)
    xa, b = torch.randn(64, 16, device=dev, dtype=torch.bfloat16), torch.randn(256, 16, device=dev, dtype=torch.bfloat16)
    codes, scale = quantize_rows(x)
    ops = {"torch add_": lambda: x.add_(0.0), "tensor.to(fp32)": lambda: x.to(torch.float32),
           "empty": lambda: torch.empty(64, 256, device=dev),
           "scaled_mm": lambda: scaled_mm(codes, scale, codes.t(), scale.view(1, -1), torch.bfloat16),
           "quantize_rows (triton)": lambda: quantize_rows(x), "lora_add_ (triton)": lambda: lora_add_(x, xa, b, 1.0),
           "rms_norm fwd (triton)": lambda: rms_norm(x, w, 1e-5)}
    out = {}
    for name, op in ops.items():
        for _ in range(20):
            op()
        torch.cuda.synchronize()
        tick = time.perf_counter()
        for _ in range(calls):
            op()
        out[name] = round(1e6 * (time.perf_counter() - tick) / calls, 1)
        torch.cuda.synchronize()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(parser)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--precisions", default="bf16,fp8")
    parser.add_argument("--out", default="host_profile.json")
    parser.add_argument("--python", action="store_true", help="add a cProfile ranking of 3 steps")
    args = parser.parse_args()
    from kernels import patch_model
    model = add_lora(build_model(args.shape, False))
    model.config.use_cache = False
    batches = make_batches(args.shape, args.bs, args.seq)
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "shape": args.shape,
               "bs": args.bs, "seq": args.seq}
    results["launch_us"] = launch_costs()
    print(json.dumps({"launch_us": results["launch_us"]}), flush=True)
    for precision in args.precisions.split(","):   # bf16 first: FP8 quantization frees the bf16 weights
        patch_model(model, backend="triton", base_precision=precision)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        phase_times(model, batches, opt, 3)   # warm-up: compiles, autotunes, allocator
        row = {"phases": phase_times(model, batches, opt, args.steps), **profiled_step(model, batches, opt, args.top)}
        if args.python:
            row["cprofile"] = python_profile(model, batches, opt, 3, args.top)
        results[precision] = row
        print(json.dumps({"precision": precision, **row["phases"], "launches": row["kernel_launches"]}), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))   # after each: a killed run keeps the first


if __name__ == "__main__":
    main()
