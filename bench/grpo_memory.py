"""Where a GRPO job's GPU memory peaks, phase by phase (issue 38: the budgeted 1B job at 256 tokens
peaked 0.93 GiB above the fit check's policy step on 2026-12-05, and an earlier plan by 0.98 GiB).

Runs `python -m jobs.train CONFIG` in this process with GRPO's sampling (prepare_step) wrapped: for
each optimizer step it records the allocated bytes before sampling, sampling's peak, what stays
allocated after it (and after a gc.collect(), in case a reference cycle holds the decoder), and the
policy step's peak (from the reset after sampling to the next sampling). One JSON line a step:

    python bench/grpo_memory.py .benchdata/grpo/grpo-llama-3.2-1b.yaml --out $OUT/grpo_memory.jsonl
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 1024 ** 3


def watch(out: Path) -> None:
    import torch
    from jobs.train.methods import grpo
    sample = grpo.GroupRelativePolicyOptimization.prepare_step
    state = {"step": 0}

    def prepare_step(self, group):
        torch.cuda.synchronize()
        row = {"step": state["step"], "policy_peak_gib": torch.cuda.max_memory_allocated() / GIB,
               "before_sampling_gib": torch.cuda.memory_allocated() / GIB}
        torch.cuda.reset_peak_memory_stats()
        trained = sample(self, group)
        torch.cuda.synchronize()
        row.update(sampling_peak_gib=torch.cuda.max_memory_allocated() / GIB,
                   after_sampling_gib=torch.cuda.memory_allocated() / GIB)
        gc.collect()
        row["after_gc_gib"] = torch.cuda.memory_allocated() / GIB
        torch.cuda.reset_peak_memory_stats()
        with open(out, "a") as fh:   # policy_peak_gib belongs to the step before this one
            fh.write(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}) + "\n")
        state["step"] += 1
        return trained
    grpo.GroupRelativePolicyOptimization.prepare_step = prepare_step


def peak_holders(trace: list[dict], top: int = 12) -> dict:
    """From torch.cuda.memory's allocation trace: the most bytes live at once over the trace, and the
    largest allocations live at that moment with the Python frames that made them."""
    live, now, best, at = {}, 0, 0, {}
    for event in trace:
        action, addr, size = event.get("action"), event.get("addr"), event.get("size", 0)
        if action == "alloc":
            live[addr] = event
            now += size
            if now > best:
                best, at = now, dict(live)
        elif action in ("free_requested", "free_completed") and addr in live:
            now -= live.pop(addr).get("size", 0)
    holders = sorted(at.values(), key=lambda e: -e.get("size", 0))[:top]
    return {"trace_peak_gib": round(best / GIB, 3),
            "holders": [{"gib": round(e.get("size", 0) / GIB, 4), "at": _where(e, 4)} for e in holders]}


def survivors(trace: list[dict], top: int = 12) -> dict:
    """The allocations made in the trace and still alive at its end (what one step leaves behind:
    2026-12-05, the allocated bytes before sampling grew ~31 MiB a step), grouped by where they were
    made, largest first."""
    live = {}
    for event in trace:
        action, addr = event.get("action"), event.get("addr")
        if action == "alloc":
            live[addr] = event
        elif action in ("free_requested", "free_completed"):
            live.pop(addr, None)
    groups: dict[tuple, list] = {}
    for event in live.values():
        groups.setdefault(tuple(_where(event)), []).append(event.get("size", 0))
    ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"left_gib": round(sum(e.get("size", 0) for e in live.values()) / GIB, 4),
            "left": [{"gib": round(sum(sizes) / GIB, 4), "count": len(sizes), "at": list(at)}
                     for at, sizes in ranked]}


@functools.cache
def _torch_folder() -> str:
    import torch   # imported where it is first needed, as in the rest of this script
    return str(Path(torch.__file__).parent) + "/"


def _where(event: dict, depth: int = 6) -> list[str]:
    """The innermost Python frames outside torch's own package. (The trace of 2026-12-05 filtered on a
    "/torch/" substring and showed no transformers or PEFT frame at all: a path test is exact.)"""
    frames = [f for f in event.get("frames", []) if f.get("filename", "").endswith(".py")
              and not f.get("filename", "").startswith(_torch_folder())]
    return [f"{Path(f['filename']).parent.name}/{Path(f['filename']).name}:{f.get('line')} {f.get('name')}"
            for f in frames[:depth]]


def trace_step(out: Path, step: int) -> None:
    """Record every allocation of optimizer step `step` (sampling and policy) and write its holders."""
    import torch
    from jobs.train.methods import grpo
    sample = grpo.GroupRelativePolicyOptimization.prepare_step
    count = {"n": 0}

    def prepare_step(self, group):
        if count["n"] == step:
            torch.cuda.memory._record_memory_history(max_entries=400000)
        elif count["n"] == step + 1:
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            trace = [e for dev in snapshot.get("device_traces", []) for e in dev]
            with open(out, "a") as fh:
                fh.write(json.dumps({"traced_step": step, **peak_holders(trace), **survivors(trace)}) + "\n")
        count["n"] += 1
        return sample(self, group)
    grpo.GroupRelativePolicyOptimization.prepare_step = prepare_step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--trace-step", type=int, default=-1, help="also trace this step's allocations")
    args = parser.parse_args()
    if args.trace_step >= 0:
        trace_step(args.out, args.trace_step)
    watch(args.out)
    from jobs.train.cli import main as train
    return train([str(args.config), "--max_steps", str(args.steps)])


if __name__ == "__main__":
    sys.exit(main())
