"""The FP8 toggle's measured effect, read from bench/results (never a number typed into the UI).

Rows are bench/bench_fp8.py's lines (in lora.jsonl, or any fp8*.jsonl): our engine ("stack":
"fusetune"), a variant "PRECISION[+SWITCH]:CHECKPOINTING" or a "base_precision" key, tokens/s and
peak GiB. An fp8 row is paired with the bf16 row of the same run conditions (GPU, model shape,
batch, sequence length, checkpointing), as bench/fp8_summary.py pairs them; the newest pair per
shape is shown, the largest model first.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from studio.i18n import t

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


@dataclass(frozen=True)
class Fp8Effect:
    gpu: str
    shape: str
    checkpointing: str
    fp8_tokens_per_s: float
    bf16_tokens_per_s: float
    fp8_gib: float
    bf16_gib: float

    @property
    def speedup(self) -> float:
        return self.fp8_tokens_per_s / self.bf16_tokens_per_s


def _precision(row: dict) -> str | None:
    if row.get("base_precision") in ("fp8", "bf16"):
        return row["base_precision"]
    name = str(row.get("variant", "")).split(":")[0]
    return name if name in ("fp8", "bf16") else None


def _rows(folder: Path) -> list[dict]:
    rows = []
    for path in sorted({*folder.glob("lora.jsonl"), *folder.glob("fp8*.jsonl")}):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue   # a line cut by a killed run: the others still count
            plain = str(row.get("variant", "")).split(":")[0] in ("fp8", "bf16")   # no +switches
            if (isinstance(row, dict) and row.get("stack") == "fusetune" and _precision(row) and plain
                    and row.get("tokens_per_s") and row.get("peak_gib") and row.get("fits", True)):
                rows.append(row)
    return rows


def measured_effects(folder: Path = RESULTS) -> list[Fp8Effect]:
    """The newest fp8/bf16 pair per model shape, largest shape first (by bf16 peak memory)."""
    newest: dict[tuple, dict[str, dict]] = {}
    for row in sorted(_rows(folder), key=lambda r: r.get("time", "")):
        key = (row.get("gpu"), row["shape"], row.get("bs"), row.get("seq"), str(row.get("checkpointing")))
        newest.setdefault(key, {})[_precision(row)] = row
    by_shape: dict[str, Fp8Effect] = {}
    for (gpu, shape, _bs, _seq, mode), pair in newest.items():
        if "fp8" in pair and "bf16" in pair:
            fp8, bf16 = pair["fp8"], pair["bf16"]
            by_shape[shape] = Fp8Effect(gpu or "?", shape, mode, fp8["tokens_per_s"], bf16["tokens_per_s"],
                                        fp8["peak_gib"], bf16["peak_gib"])
    return sorted(by_shape.values(), key=lambda e: -e.bf16_gib)


def effect_text(lang: str, folder: Path = RESULTS) -> str:
    """One sentence for the toggle's help: the measured effect, or that it was not measured."""
    effects = measured_effects(folder)
    if not effects:
        return t("fp8.not_measured", lang)
    parts = [t("fp8.measured_one", lang, shape=e.shape, checkpointing=e.checkpointing,
               fp8=f"{e.fp8_tokens_per_s:,.0f}", bf16=f"{e.bf16_tokens_per_s:,.0f}", ratio=f"{e.speedup:.2f}",
               fp8_gib=f"{e.fp8_gib:.1f}", bf16_gib=f"{e.bf16_gib:.1f}") for e in effects[:2]]
    return t("fp8.measured", lang, gpu=effects[0].gpu, effects="; ".join(parts))
