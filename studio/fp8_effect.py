"""The FP8 toggle's measured effect, read from bench/results (never a number typed into the UI).

What a user feels is a training job, so job rows come first: bench/bench_job.py's lines in
job.jsonl (`python -m jobs.train` on generated chat data, real tokens/s), our engine, an fp8 and a
bf16 job of the same GPU, shape, batch, row length and checkpointing, the eager step (no captured
CUDA graph, the default) and no engine switch set by the benchmark (bench_job --switch). Shapes
without such a pair fall back to the benchmark step: bench/bench_fp8.py's lines (in lora.jsonl, or
any fp8*.jsonl): our engine ("stack": "fusetune"), a variant "PRECISION[+SWITCH]:CHECKPOINTING" or
a "base_precision" key, tokens/s and peak GiB. An fp8 row is paired with the bf16 row of the same
run conditions (GPU, model shape, batch, sequence length, checkpointing), as bench/fp8_summary.py (in git history)
pairs them; per shape the pair measured last is shown, the largest model first.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jobs.train.graph_steps import CAPTURED_LINE
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
    source: str = "benchmark"   # "job": through jobs.train; "benchmark": bench_fp8's training step

    @property
    def speedup(self) -> float:
        return self.fp8_tokens_per_s / self.bf16_tokens_per_s


def _precision(row: dict) -> str | None:
    if row.get("base_precision") in ("fp8", "bf16"):
        return row["base_precision"]
    name = str(row.get("variant", "")).split(":")[0]
    return name if name in ("fp8", "bf16") else None


def _records(paths) -> list[dict]:
    """The JSON objects of these JSON-lines files; a line cut by a killed run is skipped, the
    others still count."""
    records = []
    for path in paths:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                records.append(row)
    return records


def _rows(folder: Path) -> list[dict]:
    rows = []
    for row in _records(sorted({*folder.glob("lora.jsonl"), *folder.glob("fp8*.jsonl")})):
        plain = str(row.get("variant", "")).split(":")[0] in ("fp8", "bf16")   # no +switches
        if (row.get("stack") == "fusetune" and _precision(row) and plain
                and row.get("tokens_per_s") and row.get("peak_gib") and row.get("fits", True)):
            rows.append(row)
    return rows


def _captured(row: dict) -> bool:
    """Whether a job replayed a captured step. What the job logged decides, not the environment it was
    started in: an unset FUSETUNE_CUDA_GRAPH ("auto" in the row) meant capture in some rows and eager
    in later ones, when the default changed."""
    if "cuda_graph" in row:
        return row["cuda_graph"] == "on"
    if row.get("log_head"):
        return any(CAPTURED_LINE in line for line in row["log_head"])
    return row.get("cuda_graph_env") == "1"


def _job_rows(folder: Path) -> list[dict]:
    """job.jsonl's finished eager jobs of our engine with its defaults (no bench switch), as
    benchmark-like rows (shape, bs, seq, ...)."""
    rows = []
    for row in _records(folder.glob("job.jsonl")):
        config = row.get("config")
        if (not isinstance(config, dict) or not str(row.get("stack", "")).startswith("fusetune")
                or row.get("returncode") != 0 or not row.get("real_tokens_per_s") or not row.get("peak_gib")
                or _captured(row) or row.get("switch") or not config.get("fused_kernels", True)):
            continue
        rows.append({"gpu": row.get("gpu"), "shape": row.get("shape"), "bs": config.get("batch_size"),
                     "seq": config.get("max_seq_length"), "checkpointing": config.get("gradient_checkpointing"),
                     "base_precision": config.get("base_precision", "bf16"), "time": row.get("time", ""),
                     "tokens_per_s": row["real_tokens_per_s"], "peak_gib": row["peak_gib"]})
    return rows


def _newest_pairs(rows: list[dict], source: str) -> dict[str, Fp8Effect]:
    """The newest fp8/bf16 pair of the same run conditions, per model shape."""
    newest: dict[tuple, dict[str, dict]] = {}
    for row in sorted(rows, key=lambda r: r.get("time", "")):
        key = (row.get("gpu"), row["shape"], row.get("bs"), row.get("seq"), str(row.get("checkpointing")))
        newest.setdefault(key, {})[_precision(row)] = row
    by_shape: dict[str, Fp8Effect] = {}
    complete = [(key, pair) for key, pair in newest.items() if "fp8" in pair and "bf16" in pair]
    complete.sort(key=lambda item: max(row.get("time", "") for row in item[1].values()))
    for (gpu, shape, _bs, _seq, mode), pair in complete:   # the newest pair is the last one written
        fp8, bf16 = pair["fp8"], pair["bf16"]
        by_shape[shape] = Fp8Effect(gpu or "?", shape, mode, fp8["tokens_per_s"], bf16["tokens_per_s"],
                                    fp8["peak_gib"], bf16["peak_gib"], source)
    return by_shape


def measured_effects(folder: Path = RESULTS) -> list[Fp8Effect]:
    """Per model shape the newest job pair, else the newest benchmark pair; largest shape first
    (by bf16 peak memory)."""
    by_shape = {**_newest_pairs(_rows(folder), "benchmark"), **_newest_pairs(_job_rows(folder), "job")}
    return sorted(by_shape.values(), key=lambda e: -e.bf16_gib)


def _sentence(e: Fp8Effect, lang: str) -> str:
    numbers = dict(shape=e.shape, checkpointing=e.checkpointing, fp8=f"{e.fp8_tokens_per_s:,.0f}",
                   bf16=f"{e.bf16_tokens_per_s:,.0f}", ratio=f"{e.speedup:.2f}", fp8_gib=f"{e.fp8_gib:.1f}",
                   bf16_gib=f"{e.bf16_gib:.1f}")
    if e.source == "job":
        return t("fp8.measured_job", lang, **numbers)
    return t("fp8.measured_benchmark", lang, **numbers)


def effect_text(lang: str, folder: Path = RESULTS) -> str:
    """One sentence for the toggle's help: the measured effect, or that it was not measured."""
    effects = measured_effects(folder)
    if not effects:
        return t("fp8.not_measured", lang)
    parts = [_sentence(e, lang) for e in effects[:2]]
    return t("fp8.measured", lang, gpu=effects[0].gpu, effects="; ".join(parts))
