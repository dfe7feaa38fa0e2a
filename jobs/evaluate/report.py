"""What an evaluation writes into its folder (jobs/io/layout.py EvalLayout): rows.jsonl as the rows are
scored (so a cancelled run keeps what it did), then rows.csv and results.json at the end. Files are
written beside and renamed (jobs/io/storage.py's rule): a reader never sees half a table."""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from jobs.io.layout import EvalLayout, JobLayout


def prompt_text(prompt) -> str:
    """A prompt for a table cell: text as is, chat messages as `role: content` lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))


def changes(scores: dict) -> dict:
    """tuned - base per metric both scored: what the per-row view sorts by."""
    base, tuned = scores["base"], scores["tuned"]
    return {m: tuned[m] - base[m] for m in base if base[m] is not None and tuned.get(m) is not None}


def append_rows(layout: EvalLayout, records: list[dict]) -> None:
    with open(layout.rows, "a", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_rows(layout: EvalLayout) -> list[dict]:
    if not layout.rows.is_file():
        return []
    rows = []
    for line in layout.rows.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue   # a line torn by a kill
    return rows


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def csv_text(rows: list[dict]) -> str:
    """One line a row: prompt, reference, both answers, then base_/tuned_/change_ per metric."""
    metrics: dict[str, None] = {}
    for row in rows:
        metrics.update(dict.fromkeys(row["scores"]["base"]))
    head = ["row", "prompt", "reference", "base_answer", "tuned_answer"]
    head += [f"{side}_{m}" for m in metrics for side in ("base", "tuned", "change")]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(head)
    for row in rows:
        cells = [row["row"], prompt_text(row["prompt"]), row.get("reference") or "", row.get("base") or "",
                 row.get("tuned") or ""]
        for m in metrics:
            cells += [row["scores"]["base"].get(m), row["scores"]["tuned"].get(m), row["change"].get(m)]
        writer.writerow(["" if c is None else c for c in cells])
    return out.getvalue()


def write_results(layout: EvalLayout, summary: dict, rows: list[dict]) -> None:
    _write_atomic(layout.rows_csv, csv_text(rows))
    _write_atomic(layout.results, json.dumps(summary, ensure_ascii=False, indent=1) + "\n")


def write_benchmarks(layout: EvalLayout, benchmarks: dict) -> None:
    _write_atomic(layout.benchmarks, json.dumps(benchmarks, ensure_ascii=False, indent=1) + "\n")


def latest(job_dir: str | Path) -> EvalLayout | None:
    """The job's evaluation whose results were written last (a cancelled one's too: it has its rows'
    table), or None when none has results yet."""
    evaluations = JobLayout(job_dir).evaluations
    done = [layout for layout in map(EvalLayout, evaluations.iterdir() if evaluations.is_dir() else [])
            if layout.results.is_file()]
    return max(done, key=lambda layout: (layout.results.stat().st_mtime, layout.root.name), default=None)


def read_results(layout: EvalLayout) -> dict | None:
    """results.json (docs/contracts.md, "Evaluate"), or None when absent or unreadable."""
    try:
        results = json.loads(layout.results.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return results if isinstance(results, dict) else None
