"""events.jsonl: what a job reports, one JSON object a line (schema in docs/contracts.md).

The trainer appends; the studio reads. Writes are whole lines flushed at once so a reader never
sees half an event; a torn last line (a job killed mid-write) is skipped, not fatal."""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.layout import JobLayout

EVENT_TYPES = ("start", "step", "eval", "checkpoint", "done", "error")
ERROR_KINDS = ("oom", "data", "config", "nan", "killed", "internal")


class EventWriter:
    def __init__(self, job_dir: str | Path):
        self.path = JobLayout(job_dir).events
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, type: str, **fields: Any) -> dict[str, Any]:
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}")
        if type == "error" and fields.get("kind") not in ERROR_KINDS:
            raise ValueError(f"error events need a kind in {ERROR_KINDS}")
        event = {"type": type, "time": time.time(), **fields}
        line = json.dumps(_finite(event), ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        return event


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf; write them as null so every reader can parse the line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read_events(job_dir: str | Path) -> list[dict[str, Any]]:
    path = JobLayout(job_dir).events
    if not path.is_file():
        return []
    events = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a kill; the rest of the file is still good
    return events


@dataclass
class JobSummary:
    start: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None  # the done or error event

    @property
    def last_step(self) -> dict[str, Any] | None:
        return self.steps[-1] if self.steps else None

    @property
    def progress(self) -> float:
        if self.final and self.final["type"] == "done":
            return 1.0
        last = self.last_step
        if not last or not last.get("max_steps"):
            return 0.0
        return min(1.0, last["step"] / last["max_steps"])

    @property
    def eta_s(self) -> float | None:
        last = self.last_step
        return None if self.final or not last else last.get("eta_s")


def summarize(job_dir: str | Path) -> JobSummary:
    return summarize_events(read_events(job_dir))


def summarize_events(events: list[dict[str, Any]]) -> JobSummary:
    """The events of one job sorted by type (for readers that already hold the list)."""
    summary = JobSummary()
    for event in events:
        kind = event.get("type")
        if kind == "start":
            summary.start = event
        elif kind == "step":
            summary.steps.append(event)
        elif kind == "checkpoint":
            summary.checkpoints.append(event)
        elif kind == "eval":
            summary.evals.append(event)
        elif kind in ("done", "error"):
            summary.final = event
    return summary


def tail_log(job_dir: str | Path, lines: int = 200, max_bytes: int = 256_000) -> str:
    """The last `lines` lines of train.log, reading at most `max_bytes` from its end."""
    path = JobLayout(job_dir).log
    if not path.is_file():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        data = fh.read()
    text = data.decode("utf-8", errors="replace").replace("\r", "\n")
    return "\n".join(text.splitlines()[-lines:])
