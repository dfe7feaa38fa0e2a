"""The README's speed table of jobs (SFT and preference), generated from bench/results/job.jsonl (issue 38: "the README's
performance table is generated from those lines"), so that a number in the README is always a
recorded measurement and a re-measurement changes the table by changing the row it picks.

    python bench/readme_tables.py           # rewrite the table between its markers in README.md
    python bench/readme_tables.py --check   # exit 1 when README.md's table differs (tests/test_readme_tables.py)

Each README row names the two result lines it shows (shape, method, stack and the minute of the run, as
recorded), ours and the peer measured in the same device call; ours within the peer's peak
(`max_gpu_memory_gb`), both in pair tokens/s (prompt + chosen + rejected counted once; SFT: real tokens/s) and peak GiB of
torch's allocated memory. A ratio is bold when both runs followed issue 38's protocol (>= 30 steps)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "job.jsonl"
README = ROOT / "README.md"
BEGIN, END = "<!-- bench:preference-table -->", "<!-- /bench:preference-table -->"
PROTOCOL_STEPS = 30


@dataclass(frozen=True)
class Pick:
    """One result line: its shape, method, stack prefix and the minute it was recorded."""
    shape: str
    method: str
    stack: str
    minute: str   # "YYYY-MM-DDTHH:MM" of the line's "time"


@dataclass(frozen=True)
class Row:
    label: str
    ours: Pick
    peer: Pick | None   # None: a budget row (ours alone, within a stated budget)


ROWS = (
    Row("SFT, Llama-3.2-1B, 4×4,096 a step, packing (H200, 2026-12-06 13:58, 40 steps)",
        Pick("llama-3.2-1b", "sft", "fusetune", "2026-12-06T13:59"),
        Pick("llama-3.2-1b", "sft", "unsloth+trl", "2026-12-06T13:58")),
    Row("SFT, Llama-3.2-1B, 4×4,096 a step, packing (H100, 2026-12-07 00:52, 40 steps)",
        Pick("llama-3.2-1b", "sft", "fusetune", "2026-12-07T00:53"),
        Pick("llama-3.2-1b", "sft", "unsloth+trl", "2026-12-07T00:52")),
    Row("SFT, Llama-3.1-8B, 2×4,096 a step, packing (H200, 2026-12-06 13:52, 40 steps)",
        Pick("llama-3.1-8b", "sft", "fusetune", "2026-12-06T13:53"),
        Pick("llama-3.1-8b", "sft", "unsloth+trl", "2026-12-06T13:52")),
    Row("SFT, Llama-3.1-8B, 2×4,096 a step, packing (H100, 2026-12-07 00:54, 40 steps)",
        Pick("llama-3.1-8b", "sft", "fusetune", "2026-12-07T00:55"),
        Pick("llama-3.1-8b", "sft", "unsloth+trl", "2026-12-07T00:54")),
    Row("SFT, Llama-3.1-8B within 19.8 GiB (H200, 2026-12-06, 40 steps; 91 % of the 14,270 ceiling)",
        Pick("llama-3.1-8b", "sft", "fusetune", "2026-12-06T13:56"), None),
    Row("DPO, Llama-3.1-8B, prompts once (H100, 2026-12-06 02:02, 40 steps)",
        Pick("llama-3.1-8b", "dpo", "fusetune", "2026-12-06T02:05"),
        Pick("llama-3.1-8b", "dpo", "unsloth+trl", "2026-12-06T02:02")),
    Row("DPO, Llama-3.1-8B within 19.39 GiB (2026-12-04, 40 steps)",
        Pick("llama-3.1-8b", "dpo", "fusetune", "2026-12-04T16:51"), None),
    Row("ORPO, Llama-3.1-8B, prompts once (H100, 2026-12-06 04:52, 40 steps)",
        Pick("llama-3.1-8b", "orpo", "fusetune", "2026-12-06T04:54"),
        Pick("llama-3.1-8b", "orpo", "unsloth+trl", "2026-12-06T04:52")),
    Row("KTO, Llama-3.1-8B, 8 examples a step, prompts once, KL completions riding along (H100, 2026-12-07 09:34, "
        "40 steps)",
        Pick("llama-3.1-8b", "kto", "fusetune", "2026-12-07T09:36"),
        Pick("llama-3.1-8b", "kto", "unsloth+trl", "2026-12-07T09:34")),
    Row("ORPO, Llama-3.2-1B, prompts once (H100, 2026-12-06 01:55, 40 steps)",
        Pick("llama-3.2-1b", "orpo", "fusetune", "2026-12-06T01:57"),
        Pick("llama-3.2-1b", "orpo", "unsloth+trl", "2026-12-06T01:55")),
    Row("DPO, Llama-3.2-1B, prompts once (H100, 2026-12-05 19:42, 40 steps)",
        Pick("llama-3.2-1b", "dpo", "fusetune", "2026-12-05T19:43"),
        Pick("llama-3.2-1b", "dpo", "unsloth+trl", "2026-12-05T19:42")),
    Row("KTO, Llama-3.2-1B, 8 examples a step, prompts once (H100, 2026-12-07 09:39, 40 steps)",
        Pick("llama-3.2-1b", "kto", "fusetune", "2026-12-07T09:41:40"),   # the whole units (the 1B's default)
        Pick("llama-3.2-1b", "kto", "unsloth+trl", "2026-12-07T09:39")),
    # the same job on another H100 host: a host-bound step moves with the host (bench/NOTES.md session 68)
    Row("KTO, Llama-3.2-1B, the same job again (H100, 2026-12-07 19:02, 40 steps)",
        Pick("llama-3.2-1b", "kto", "fusetune", "2026-12-07T19:03"),
        Pick("llama-3.2-1b", "kto", "unsloth+trl", "2026-12-07T19:02")),
)


def load(path: Path = RESULTS) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("{")]


def find(lines: list[dict], pick: Pick) -> dict:
    """The first line `pick` names (the first of a minute: a budget pair shares it with its sibling)."""
    for line in lines:
        if (line.get("shape") == pick.shape and line.get("method") == pick.method
                and str(line.get("stack", "")).startswith(pick.stack) and str(line.get("time", "")).startswith(pick.minute)):
            return line
    raise SystemExit(f"bench/readme_tables.py: no line in {RESULTS.name} for {pick}")


def _speed(line: dict) -> float:
    """Pair tokens/s of a preference line, real (non-pad) tokens/s of an SFT line."""
    return line["pair_tokens_per_s"] if "pair_tokens_per_s" in line else line["real_tokens_per_s"]


def _cell(line: dict) -> str:
    return f"{_speed(line):,.0f} ({line['peak_gib']:.2f})"


def render_row(row: Row, lines: list[dict]) -> str:
    ours = find(lines, row.ours)
    if row.peer is None:
        budget = ours.get("config", {}).get("max_gpu_memory_gb")
        verdict = "the budget holds" if ours["peak_gib"] <= budget * 1.03 else f"over its {budget} GiB budget"
        return f"| {row.label} | {_cell(ours)} | | {verdict} |"
    peer = find(lines, row.peer)
    ratio = _speed(ours) / _speed(peer)
    memory = ours["peak_gib"] / peer["peak_gib"]
    text = f"{ratio:.1f}x at {memory:.2f}x memory"
    steady = min(ours.get("steps", 0), peer.get("steps", 0)) >= PROTOCOL_STEPS
    return f"| {row.label} | {_cell(ours)} | {_cell(peer)} | {'**' + text + '**' if steady else text} |"


def table(lines: list[dict]) -> str:
    head = ["| job | Fusetune | Unsloth + TRL | ratio |", "|---|---|---|---|"]
    return "\n".join(head + [render_row(row, lines) for row in ROWS])


def replaced(readme: str, body: str) -> str:
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + body + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md's table is not the generated one")
    args = parser.parse_args(argv)
    readme = README.read_text(encoding="utf-8")
    wanted = replaced(readme, table(load()))
    if args.check:
        if wanted != readme:
            print("README.md's preference table differs from bench/results/job.jsonl: run python bench/readme_tables.py")
            return 1
        return 0
    README.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
