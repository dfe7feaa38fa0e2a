"""What is alive on the GPU at the peak of one LoRA training step, grouped by the Python line that
allocated it (torch.cuda.memory history), plus the peak of each phase (forward, backward, optimizer).

Two warm-up steps (so AdamW's states exist, as in the timed steps of bench_lora.py), then one
recorded step. The allocator trace is replayed to find the moment of the peak; every block alive
then is charged to the innermost frame outside torch itself. Blocks alive before the recorded step
(weights, LoRA parameters, optimizer states) are reported as one "static" number.

    python bench/memory_peak.py --shape llama-3.1-8b --bs 2 --seq 2048 --checkpointing offload
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_lora import SHAPES, add_lora, add_shape_args, build_model, setup_stack  # noqa: E402

GB = 1e9


def _owner(frames) -> str:
    for frame in frames or []:
        name = frame.get("filename", "")
        if "/torch/" not in name and "<" not in name:
            short = "/".join(name.split("/")[-2:])
            return f"{short}:{frame.get('line')} {frame.get('name')}"
    return "<no python frame>" if not frames else f"torch:{frames[0].get('name')}"


def live_at_peak(trace) -> tuple[int, dict]:
    """(peak bytes above the start, {owner: [bytes, blocks]}) from one device's allocator trace."""
    live, total, peak, peak_at = {}, 0, 0, -1
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            total += event["size"]
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
        if total > peak:
            peak, peak_at = total, i
    live = {}
    for event in trace[: peak_at + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    groups = defaultdict(lambda: [0, 0])
    for event in live.values():
        owner = _owner(event.get("frames"))
        groups[owner][0] += event["size"]
        groups[owner][1] += 1
    return peak, dict(groups)


def main() -> None:
    parser = argparse.ArgumentParser()
    add_shape_args(parser, None)
    parser.add_argument("--checkpointing", default="on")
    parser.add_argument("--out", default="memory_peak.json")
    args = parser.parse_args()
    model = add_lora(build_model(args.shape, False))
    model.config.use_cache = False
    report = setup_stack(model, "fusetune", args.checkpointing, args.bs * args.seq)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    x = torch.randint(0, SHAPES[args.shape]["vocab_size"], (args.bs, args.seq), device="cuda")
    phases = {}

    def step(measure: bool):
        marks = [("forward", lambda: model(input_ids=x, labels=x).loss)]
        loss = None
        for name, fn in marks + [("backward", lambda: loss.backward()),
                                 ("optimizer", lambda: (opt.step(), opt.zero_grad(set_to_none=True)))]:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            out = fn()
            loss = out if name == "forward" else loss
            torch.cuda.synchronize()
            if measure:
                phases[name] = round(torch.cuda.max_memory_allocated() / GB, 3)

    step(False)
    step(False)
    static = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
    step(True)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, groups = live_at_peak(snapshot["device_traces"][0])
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])[:25]
    result = {"config": vars(args), "report": report, "static_gb": round(static / GB, 3),
              "peak_gb": round((static + peak) / GB, 3), "phase_peaks_gb": phases,
              "live_at_peak_mb": [[owner, round(b / 1e6, 1), n] for owner, (b, n) in top]}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("config", "static_gb", "peak_gb", "phase_peaks_gb")}))
    for owner, mb, n in result["live_at_peak_mb"][:16]:
        print(f"{mb:9.1f} MB  x{n:<4d} {owner[:110]}")


if __name__ == "__main__":
    main()
