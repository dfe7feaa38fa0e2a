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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(parser)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--precisions", default="bf16,fp8")
    parser.add_argument("--out", default="host_profile.json")
    args = parser.parse_args()
    from kernels import patch_model
    model = add_lora(build_model(args.shape, False))
    model.config.use_cache = False
    batches = make_batches(args.shape, args.bs, args.seq)
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "shape": args.shape,
               "bs": args.bs, "seq": args.seq}
    for precision in args.precisions.split(","):   # bf16 first: FP8 quantization frees the bf16 weights
        patch_model(model, backend="triton", base_precision=precision)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        phase_times(model, batches, opt, 3)   # warm-up: compiles, autotunes, allocator
        row = {"phases": phase_times(model, batches, opt, args.steps), **profiled_step(model, batches, opt, args.top)}
        results[precision] = row
        print(json.dumps({"precision": precision, **row["phases"], "launches": row["kernel_launches"]}), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))   # after each: a killed run keeps the first


if __name__ == "__main__":
    main()
