"""events.jsonl: what a job reports, one JSON object a line (schema in docs/contracts.md).

The trainer appends; the studio reads. Writes are whole lines flushed at once so a reader never
sees half an event; a torn last line (a job killed mid-write) is skipped, not fatal, and so is a
file that cannot be read at all: a page that lists jobs must never fail because of one job.

A run resumed into the same folder appends its own start event. The reader, not the writer, makes
that consistent: a start event supersedes whatever the earlier run reported after the step it
resumed from (`resumed_at`), so the steps, checkpoints and evals of a summary never repeat a step and
the earlier run's done/error event no longer counts."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.io.layout import JobLayout

EVENT_TYPES = ("phase", "start", "step", "eval", "checkpoint", "done", "error")
ERROR_KINDS = ("oom", "data", "config", "nan", "killed", "io", "internal")


class EventWriter:
    """Appends events to events.jsonl, then hands each written event to `sinks` (callables such as
    jobs.io.tracking.Trackers): listeners see exactly what the file holds, and a sink that fails never
    loses an event from the file."""

    def __init__(self, job_dir: str | Path, sinks: list | None = None):
        self.path = JobLayout(job_dir).events
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.sinks = list(sinks or [])

    def emit(self, type: str, **fields: Any) -> dict[str, Any]:
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}")
        if type == "error" and fields.get("kind") not in ERROR_KINDS:
            raise ValueError(f"error events need a kind in {ERROR_KINDS}")
        event = {"type": type, "time": time.time(), **fields}
        line = json.dumps(_finite(event), ensure_ascii=False) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        for sink in self.sinks:
            try:
                sink(json.loads(line))
            except Exception as exc:  # a listener's failure is its own, never the job's
                print(f"[events] a listener failed on a {type} event: {type(exc).__name__}: {exc}", file=sys.stderr)
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
    """Every event of a job that can be read; unreadable lines and files are skipped (and logged)."""
    path = JobLayout(job_dir).events
    events = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a kill; the rest of the file is still good
                if isinstance(event, dict):
                    events.append(event)
    except FileNotFoundError:
        return []
    except OSError as exc:
        print(f"[events] cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
    return events


@dataclass
class JobSummary:
    start: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None  # the done or error event
    phase: dict[str, Any] | None = None  # the latest phase event of a run that has not started yet

    @property
    def last_step(self) -> dict[str, Any] | None:
        return self.steps[-1] if self.steps else None

    @property
    def progress(self) -> float:
        if self.final and self.final["type"] == "done":
            return 1.0
        last = self.last_step
        total = last.get("max_steps") if last else None
        if not isinstance(total, (int, float)) or total <= 0:
            return 0.0
        return min(1.0, last["step"] / total)

    @property
    def eta_s(self) -> float | None:
        last = self.last_step
        return None if self.final or not last else last.get("eta_s")


def _step(event: dict[str, Any]) -> int:
    step = event.get("step")
    return step if isinstance(step, int) else 0


def summarize(job_dir: str | Path) -> JobSummary:
    return summarize_events(read_events(job_dir))


def summarize_events(events: list[dict[str, Any]]) -> JobSummary:
    """The events of one job sorted by type (for readers that already hold the list)."""
    summary = JobSummary()
    for event in events:
        _apply(summary, event)
    return summary


def _apply(summary: JobSummary, event: dict[str, Any]) -> None:
    kind = event.get("type")
    if kind == "phase":
        summary.phase = event
    elif kind == "start":
        _supersede(summary, event)
        summary.phase = None
    elif kind == "step" and isinstance(event.get("step"), int):
        summary.steps.append(event)
    elif kind == "checkpoint":
        summary.checkpoints.append(event)
    elif kind == "eval":
        summary.evals.append(event)
    elif kind in ("done", "error"):
        summary.final = event


class EventTail:
    """One job's summary, kept up to date by reading only what was appended since the last read.

    The studio polls every job's events every ~1.5 s for every open page; re-reading and re-parsing
    the whole file each time a running job adds a step costs O(steps) per poll. Here a byte offset
    is kept: `read()` parses the new whole lines only (a torn last line waits for its end), and
    starts over when the file shrank or was replaced (another inode). Each change gives a new
    JobSummary (lists copied, then extended), so a summary handed out earlier never changes under
    its reader."""

    def __init__(self, job_dir: str | Path):
        self.path = JobLayout(job_dir).events
        self.offset, self.inode = 0, None
        self.summary = JobSummary()

    def read(self) -> JobSummary:
        try:
            with open(self.path, "rb") as fh:
                stat = os.fstat(fh.fileno())
                if stat.st_ino != self.inode or stat.st_size < self.offset:
                    self.offset, self.inode, self.summary = 0, stat.st_ino, JobSummary()
                fh.seek(self.offset)
                data = fh.read(max(0, stat.st_size - self.offset))
        except FileNotFoundError:
            self.offset, self.inode, self.summary = 0, None, JobSummary()
            return self.summary
        except OSError as exc:
            print(f"[events] cannot read {self.path}: {exc.strerror or exc}", file=sys.stderr)
            return self.summary
        whole = data.rfind(b"\n") + 1
        if whole:
            self.offset += whole
            self.summary = self._extended(data[:whole])
        return self.summary

    def _extended(self, data: bytes) -> JobSummary:
        old = self.summary
        summary = JobSummary(old.start, list(old.steps), list(old.checkpoints), list(old.evals), old.final)
        for line in data.decode("utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill; the rest of the file is still good
            if isinstance(event, dict):
                _apply(summary, event)
        return summary


def _supersede(summary: JobSummary, start: dict[str, Any]) -> None:
    """A new run began in this folder: keep what the earlier runs reported up to the step this one
    resumed from (0 for a fresh start) and forget their ending."""
    resumed_at = start.get("resumed_at") if isinstance(start.get("resumed_at"), int) else 0
    summary.steps = [e for e in summary.steps if _step(e) <= resumed_at]
    summary.checkpoints = [e for e in summary.checkpoints if _step(e) <= resumed_at]
    summary.evals = [e for e in summary.evals if _step(e) <= resumed_at]
    summary.final = None
    summary.start = start


def tail_log(job_dir: str | Path, lines: int = 200, max_bytes: int = 256_000) -> str:
    """The last `lines` lines of train.log, reading at most `max_bytes` from its end."""
    path = JobLayout(job_dir).log
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:  # not written yet, deleted, or unreadable: no log to show
        return ""
    text = data.decode("utf-8", errors="replace").replace("\r", "\n")
    return "\n".join(text.splitlines()[-lines:])
