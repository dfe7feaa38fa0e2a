"""Read a device run's lora.jsonl (bench_fp8.py + unsloth_rows.py lines) and print the FP8 table: each
row's tokens/s and peak GiB, FP8 vs bf16 on the same model, and against Unsloth from the same run
(the issue-11 targets), plus the one-line help text for the studio's FP8 toggle.

    python bench/fp8_summary.py bench/results/lora.jsonl [--since 2026-12-01T00:00]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# (shape, our checkpointing mode, Unsloth's, min speed ratio, max memory ratio) from issue 11
TARGETS = [("llama-3.1-8b", "off", "off", 1.4, 0.75), ("llama-3.1-8b", "budget", "unsloth", 1.3, 1.0),
           ("llama-3.2-1b", "budget", "unsloth", 1.3, 1.0)]


def load(path: Path, since: str | None) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "tokens_per_s" in r and (since is None or r.get("time", "") >= since)]


def _mode(row) -> str:
    mode = row.get("checkpointing", "")
    return "budget" if str(mode).startswith("budget=") else mode


def best(rows, shape, stack, mode, precision=None, switches=False):
    """The fastest matching row (budget rows only where they fit); precision "fp8" matches variants
    with switches (fp8+savex, ...) only when `switches`."""
    def matches(r):
        name = r.get("variant", "").split(":")[0]
        return precision is None or name == precision or (switches and r.get("base_precision") == precision)
    found = [r for r in rows if r["shape"] == shape and r["stack"] == stack and _mode(r) == mode
             and matches(r) and r.get("fits", True)]
    return max(found, key=lambda r: r["tokens_per_s"], default=None)


def table(rows) -> list[str]:
    out = ["| shape | variant | tokens/s | peak GiB | first-step loss rel. to HF |", "|---|---|---|---|---|"]
    for r in rows:
        name = r.get("variant") or f"{r['stack']}:{r['checkpointing']}"
        rel = r.get("loss_rel_diff")
        out.append(f"| {r['shape']} | {name} | {r['tokens_per_s']:,.0f} | {r['peak_gib']:.2f} | "
                   f"{'' if rel is None else f'{rel:.1e}'} |")
    return out


def targets(rows) -> list[str]:
    out = ["| target | ours (fp8) | Unsloth | speed | memory | met |", "|---|---|---|---|---|---|"]
    for shape, mode, peer_mode, speed, memory in TARGETS:
        ours = best(rows, shape, "fusetune", mode, "fp8", switches=True)
        peer = best(rows, shape, "unsloth", peer_mode)
        if ours is None or peer is None:
            out.append(f"| {shape} {mode} | {'-' if ours is None else ours['tokens_per_s']} | "
                       f"{'-' if peer is None else peer['tokens_per_s']} | | | not measured |")
            continue
        s, m = ours["tokens_per_s"] / peer["tokens_per_s"], ours["peak_gib"] / peer["peak_gib"]
        met = s >= speed and m <= memory
        out.append(f"| {shape} {mode}: >= {speed}x at <= {memory}x memory | {ours['variant']} "
                   f"{ours['tokens_per_s']:,.0f} @ "
                   f"{ours['peak_gib']:.2f} | {peer['tokens_per_s']:,.0f} @ {peer['peak_gib']:.2f} | {s:.2f}x | "
                   f"{m:.2f}x | {'yes' if met else 'no'} |")
    return out


def help_text(rows) -> str:
    """FP8 vs bf16 on our own engine, same run, same model: the studio toggle's measured effect."""
    parts = []
    for shape, label in (("llama-3.1-8b", "Llama-3.1-8B"), ("llama-3.2-1b", "Llama-3.2-1B")):
        for mode in ("off", "offload"):
            fp8, bf16 = best(rows, shape, "fusetune", mode, "fp8"), best(rows, shape, "fusetune", mode, "bf16")
            if fp8 and bf16:
                parts.append(f"{label} ({'no recompute' if mode == 'off' else 'checkpointing'}): "
                             f"{fp8['tokens_per_s'] / bf16['tokens_per_s']:.2f}x tokens/s, "
                             f"{fp8['peak_gib']:.1f} vs {bf16['peak_gib']:.1f} GiB")
                break
    measured = "; ".join(parts) if parts else "not measured yet"
    return ("FP8 base weights (Hopper and newer): frozen base weights stored in float8 with per-channel "
            f"scales, base matrix products in FP8. Measured on an H200 against bf16: {measured}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--since", default=None, help="only lines whose time is at or after this ISO time")
    args = parser.parse_args()
    rows = load(args.path, args.since)
    print("\n".join(table(rows)), "\n", "\n".join(targets(rows)), "\n\n" + help_text(rows), sep="\n")


if __name__ == "__main__":
    main()
