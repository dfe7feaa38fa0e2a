"""Pure views of jobs for the Jobs tab: table rows, plot frames, report and failure text.

Inputs are JobRecords (jobs.store) and event dicts (jobs.events, schema in docs/contracts.md); outputs
are plain lists / pandas DataFrames that Gradio components take as values.
"""
from __future__ import annotations

import datetime as dt
import os
import threading
from typing import Any, Callable

import pandas as pd

from jobs.layout import JobLayout

TABLE_HEADERS = ["id", "name", "state", "step", "loss", "created"]


def step_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("type") == "step"]


def first_event(events: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((e for e in events if e.get("type") == kind), None)


def last_event(events: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((e for e in reversed(events) if e.get("type") == kind), None)


def format_time(epoch: float | None) -> str:
    if not epoch:
        return ""
    return dt.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")


def format_loss(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else ""


def job_row(record: Any, events: list[dict[str, Any]]) -> list[str]:
    """One table row: id, name, state, step/max, last loss (final loss once done), created."""
    last = last_event(events, "step") or {}
    done = last_event(events, "done") or {}
    max_steps = last.get("max_steps") or (record.spec or {}).get("max_steps") or ""
    step = f"{last.get('step', 0)}/{max_steps}" if max_steps else str(last.get("step", 0))
    loss = done.get("final_loss", last.get("loss"))
    return [record.id, record.name, record.state, step, format_loss(loss), format_time(record.created_at)]


def job_choice(record: Any) -> tuple[str, str]:
    """(label, value) for a job dropdown."""
    return f"{record.id} · {record.name} · {record.state}", record.id


def default_job_id(records: list[Any]) -> str | None:
    """The job to show when nothing is selected: the newest active one, else the newest."""
    for record in records:
        if record.active:
            return record.id
    return records[0].id if records else None


def _frame(rows: list[dict[str, Any]], dtypes: dict[str, str]) -> pd.DataFrame:
    """A DataFrame with fixed column dtypes even when empty: LinePlot treats an object (empty)
    column as categories, which would give a category axis for the whole job."""
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)


def loss_frame(events: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [{"step": e["step"], "loss": float(e["loss"])} for e in step_events(events)
            if isinstance(e.get("loss"), (int, float)) and "step" in e]
    return _frame(rows, {"step": "int64", "loss": "float64"})


def gpu_frames(events: list[dict[str, Any]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """GPU utilisation (%) and memory (GB) over elapsed seconds, one series per GPU."""
    util, mem = [], []
    for event in step_events(events):
        for gpu in event.get("gpus") or []:
            series = f"GPU {gpu.get('index', 0)}"
            elapsed = float(event.get("elapsed_s", event.get("step", 0)))
            if isinstance(gpu.get("util_pct"), (int, float)):
                util.append({"elapsed_s": elapsed, "util_pct": float(gpu["util_pct"]), "gpu": series})
            if isinstance(gpu.get("mem_used_gb"), (int, float)):
                mem.append({"elapsed_s": elapsed, "mem_used_gb": float(gpu["mem_used_gb"]), "gpu": series})
    return (_frame(util, {"elapsed_s": "float64", "util_pct": "float64", "gpu": "string"}),
            _frame(mem, {"elapsed_s": "float64", "mem_used_gb": "float64", "gpu": "string"}))


def rss_frame(events: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [{"elapsed_s": float(e.get("elapsed_s", 0.0)), "rss_gb": float(e["rss_gb"])}
            for e in step_events(events) if isinstance(e.get("rss_gb"), (int, float))]
    return _frame(rows, {"elapsed_s": "float64", "rss_gb": "float64"})


def cpu_frame(events: list[dict[str, Any]]) -> pd.DataFrame:
    """Machine CPU utilisation (%) over elapsed seconds (psutil, sampled at each step)."""
    rows = [{"elapsed_s": float(e.get("elapsed_s", 0.0)), "cpu_pct": float(e["cpu_pct"])}
            for e in step_events(events) if isinstance(e.get("cpu_pct"), (int, float))]
    return _frame(rows, {"elapsed_s": "float64", "cpu_pct": "float64"})


def patch_report_text(events: list[dict[str, Any]]) -> str:
    start = first_event(events, "start")
    if not start:
        return "The job has not started yet."
    lines = [f"device: {start['device']}"] if start.get("device") else []
    report = start.get("patch_report") or []
    lines += [str(line) for line in report] if report else ["(no fused-kernel report: the engine was off)"]
    return "\n".join(lines)


def failure_text(record: Any, events: list[dict[str, Any]]) -> str:
    """Why a job failed or was cancelled, from the error event and the store's reason."""
    if record.state not in ("failed", "cancelled"):
        return ""
    error = last_event(events, "error") or {}
    parts = []
    if error.get("message"):
        kind = f" ({error['kind']})" if error.get("kind") else ""
        parts.append(f"{error['message']}{kind}")
    if record.reason and record.reason != error.get("message"):
        parts.append(record.reason)
    verb = "failed" if record.state == "failed" else "was cancelled"
    return f"Job {record.id} {verb}: " + (" — ".join(parts) if parts else "no reason recorded; see the log.")


def progress_numbers(record: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    """step, max_steps, progress (0..1), eta_s, elapsed_s from the last step event."""
    last = last_event(events, "step") or {}
    step, max_steps = last.get("step", 0), last.get("max_steps") or (record.spec or {}).get("max_steps")
    progress = (step / max_steps) if max_steps else 0.0
    return {"step": step, "max_steps": max_steps, "progress": progress,
            "eta_s": last.get("eta_s"), "elapsed_s": last.get("elapsed_s")}


def has_adapter(record: Any) -> bool:
    return JobLayout(record.job_dir).has_adapter()


def exportable(record: Any) -> bool:
    """Finished jobs, and cancelled ones that saved an adapter before stopping."""
    return record.state in ("done", "cancelled") and has_adapter(record)


class EventCache:
    """read_events per job dir, re-read only when events.jsonl changed (size or mtime).

    The Jobs tab refreshes every ~1.5 s for every open browser; this keeps that to a stat call
    per job when nothing moved.
    """

    def __init__(self, reader: Callable[[str], list[dict[str, Any]]]):
        self._reader = reader
        self._entries: dict[str, tuple[tuple[int, int], list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def get(self, job_dir: str) -> list[dict[str, Any]]:
        key = self.signature(job_dir)
        if key is None:
            return []
        with self._lock:
            cached = self._entries.get(job_dir)
            if cached and cached[0] == key:
                return cached[1]
        events = self._reader(job_dir)
        with self._lock:
            self._entries[job_dir] = (key, events)
        return events

    @staticmethod
    def signature(job_dir: str) -> tuple[int, int] | None:
        """(size, mtime) of events.jsonl, or None while the job has written none."""
        try:
            stat = os.stat(JobLayout(job_dir).events)
        except OSError:
            return None
        return (stat.st_size, stat.st_mtime_ns)
