"""Where a real job's step goes: the Trainer of `python -m jobs.train` built in process from a job
YAML, `--warmup` steps run, then `--steps` steps under torch.profiler. Writes a JSON summary: wall
time, GPU busy time (union of kernel intervals) and idle share, the largest idle gaps (and, for the three
largest, the kernels either side and the host ops that overlapped them), CUDA time
by kernel (top 30) and the CPU-side ops that took longest. With `--host`, the same number of steps
again unprofiled (the true wall time a step, with Python's garbage collections in it by
generation) and under cProfile: the Python functions of the main
thread by own time (forward, loss and optimizer; autograd runs backward's Python on its own device
thread, which cProfile does not see) - where a host-bound step's time goes.

    python bench/profile_job.py CONFIG.yaml --out /tmp/profile_job.json [--host]
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_lora import GcPauses  # noqa: E402


def _timeline(prof) -> tuple[float, list[tuple], float, float]:
    """(busy ms, every idle gap as (width us, start, stop, kernel before, kernel after), first kernel start,
    last kernel end) of the GPU timeline: the union of the kernels' intervals."""
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"
                      and e.time_range.end > e.time_range.start), key=lambda e: e.time_range.start)
    busy, gaps, end, before = 0.0, [], None, None
    for kernel in kernels:
        start, stop = kernel.time_range.start, kernel.time_range.end
        if end is not None and start > end:
            gaps.append((start - end, end, start, before, kernel))
        if end is None or stop > end:
            busy += stop - (start if end is None else max(start, end))   # the part not yet covered
            end, before = stop, kernel
    first = kernels[0].time_range.start if kernels else 0
    return busy / 1000, gaps, first, end or 0


def _gap_context(prof, gaps: list[tuple], ops: int = 6) -> list[dict]:
    """What the host did while the GPU sat idle: for each of `gaps` (_timeline's), the kernels on either
    side and the CPU ops that overlapped it most (innermost first among equal overlaps, so the op that
    held the host, e.g. a sync or an allocation, comes before the module that called it)."""
    host = [e for e in prof.events() if e.device_type.name == "CPU" and e.time_range.end > e.time_range.start]
    context = []
    for width, start, stop, before, after in gaps:
        overlaps = [(min(e.time_range.end, stop) - max(e.time_range.start, start), e) for e in host]
        overlaps = sorted(((o, e) for o, e in overlaps if o > 0),
                          key=lambda oe: (-oe[0], oe[1].time_range.end - oe[1].time_range.start))
        context.append({"gap_ms": round(width / 1000, 3), "kernel_before": before.name[:80],
                        "kernel_after": after.name[:80],
                        "host_ops": [(e.name[:70], round(o / 1000, 3)) for o, e in overlaps[:ops]]})
    return context


def _timed_steps(trainer, stream, steps: int, sync) -> tuple[float, list]:
    """(wall ms a step over `steps` steps, synced at both ends, each step read; the steps, read again
    later from their host copies)."""
    sync()
    began = time.perf_counter()
    pending = [trainer.train_step(stream) for _ in range(steps)]
    for step in pending:
        step.read()
    sync()
    return (time.perf_counter() - began) * 1000 / steps, pending


def host_profile(trainer, stream, steps: int, sync) -> dict:
    """The step's unprofiled wall time with Python's collections in it, then its main-thread Python under
    cProfile (top 25 by own time)."""
    import cProfile
    import pstats
    with GcPauses() as pauses:
        plain_ms, _ = _timed_steps(trainer, stream, steps, sync)
    prof = cProfile.Profile()
    prof.enable()
    profiled_ms, _ = _timed_steps(trainer, stream, steps, sync)
    prof.disable()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:25]
    return {"wall_ms_per_step_unprofiled": round(plain_ms, 2), "gc_per_step": pauses.per_step(steps),
            "wall_ms_per_step_cprofile": round(profiled_ms, 2),
            "python_top_by_own_ms_per_step": [
                (f"{Path(file).name}:{line}:{name}", round(own * 1000 / steps, 3), round(cum * 1000 / steps, 3),
                 calls // steps) for (file, line, name), (_, calls, own, cum, _) in rows]}


def profile(config: Path, warmup: int, steps: int, host: bool = False) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from jobs.io.events import EventWriter
    from jobs.train.loader import Prefetcher
    from jobs.spec import JobSpec
    from jobs.train.loop import Trainer

    spec = JobSpec.from_yaml(config)
    spec.output_dir = tempfile.mkdtemp(prefix="profile-job-")
    trainer = Trainer(spec, Path(spec.output_dir), EventWriter(spec.output_dir), log=lambda line: None)
    trainer.prepare()
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    stream = Prefetcher(trainer.plan, 0, pin=cuda)
    for _ in range(warmup):
        trainer.train_step(stream).read()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        step_ms, pending = _timed_steps(trainer, stream, steps, sync)
    host_side = host_profile(trainer, stream, steps, sync) if host else {}
    stream.close()
    busy_ms, gaps, first, last = _timeline(prof)
    gaps = sorted(gaps, key=lambda g: -g[0])
    table = prof.key_averages()
    kernels = sorted((e for e in table if e.device_time_total > 0), key=lambda e: -e.device_time_total)
    cpu = sorted(table, key=lambda e: -e.self_cpu_time_total)
    return {"config": str(config), "steps": steps, "wall_ms_per_step": round(step_ms, 2),
            "gpu_busy_ms_per_step": round(busy_ms / steps, 2),
            "gpu_idle_share": round(1 - busy_ms / max((last - first) / 1000, 1e-9), 4),
            "largest_idle_gaps_ms": [round(g[0] / 1000, 3) for g in gaps[:10]],
            "idle_gaps_host": _gap_context(prof, gaps[:3]), "losses": [p.read()[0] for p in pending],
            "packing": trainer.packed, "real_tokens_per_step": pending[-1].tokens,
            "cuda_ms_per_step_by_kernel": [(e.key[:90], round(e.device_time_total / 1000 / steps, 3), e.count // steps)
                                           for e in kernels[:30]],
            "cpu_self_ms_per_step_top": [(e.key[:60], round(e.self_cpu_time_total / 1000 / steps, 3))
                                         for e in cpu[:15]], **host_side}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--host", action="store_true", help="also the unprofiled step and its Python under cProfile")
    parser.add_argument("--switch", default=None, help="an engine switch from bench_fp8.SWITCHES, e.g. ktonoride, "
                        "or several joined by + as bench_job.py takes them (ktoride+ktobucket)")
    args = parser.parse_args()
    if args.switch:
        from bench.bench_fp8 import SWITCHES
        for module_name, attr, value in (SWITCHES[name] for name in args.switch.split("+")):
            setattr(importlib.import_module(module_name), attr, value)
    summary = profile(args.config, args.warmup, args.steps, args.host)
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("wall_ms_per_step", "gpu_busy_ms_per_step", "gpu_idle_share",
                                              "largest_idle_gaps_ms")}))
    for name, ms, count in summary["cuda_ms_per_step_by_kernel"][:12]:
        print(f"{ms:9.3f} ms  x{count:<5} {name}")
    for name, own, cum, calls in summary.get("python_top_by_own_ms_per_step", [])[:12]:
        print(f"{own:9.3f} ms own {cum:9.3f} cum  x{calls:<5} {name}")


if __name__ == "__main__":
    main()
