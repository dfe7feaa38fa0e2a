"""(jobs/queue) What a queued job needs from a GPU, and what the studio's own process holds there.

The queue places a job by need (jobs/io/gpus.py `place`): a GPU takes the job when its free memory
covers the fit check's predicted peak plus a margin, whoever holds the rest. Two things feed it:

- the job's need, written beside its config when it is submitted (`placement.json`: the predicted
  peak in GiB, from jobs/models/fit.py, and the user's "Start anyway"); a job without a prediction asks
  for a whole GPU, as the queue always did;
- the studio's own share (`StudioGpuUse`): the Chat tab's models live in the studio's process, so
  that memory is ours, not a stranger's: before a job that needs it starts, the runner asks the
  chat engine to unload (`release`); while it cannot (a reply is being generated), the job waits
  saying so.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from jobs.io.storage import write_private_text

PLACEMENT_FILE = "placement.json"


class StudioGpuUse(Protocol):
    """The studio process's own GPU memory (the chat models), as the runner sees it."""

    def held_gb(self) -> dict[int, float]:
        """GiB held per GPU (NVML numbering) that `release` would give back."""

    def can_release(self) -> bool:
        """Whether `release` would succeed now (not while a reply is being generated)."""

    def release(self, reason: str) -> bool:
        """Unload everything held, telling the Chat tab `reason` ("job 'x'"); False when it
        cannot happen now."""


def write_need(job_dir: str | Path, need_gb: float | None) -> None:
    """Record the job's predicted peak (None: unknown) when it is submitted."""
    _write(job_dir, {**read(job_dir), "need_gb": None if need_gb is None else round(float(need_gb), 3)})


def mark_start_anyway(job_dir: str | Path) -> None:
    """The user's "Start anyway": the job starts once no job of ours holds its GPUs, whatever the
    memory other processes hold (it may then run out of memory; the fit check said so)."""
    _write(job_dir, {**read(job_dir), "start_anyway": True})


def read(job_dir: str | Path) -> dict:
    """{"need_gb": float | None, "start_anyway": bool}; both unset for a job submitted without."""
    try:
        data = json.loads((Path(job_dir) / PLACEMENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    need = data.get("need_gb")
    return {"need_gb": float(need) if isinstance(need, (int, float)) else None,
            "start_anyway": bool(data.get("start_anyway", False))}


def _write(job_dir: str | Path, data: dict) -> None:
    write_private_text(Path(job_dir) / PLACEMENT_FILE, json.dumps(data))


def studio_share(studio: StudioGpuUse | None) -> tuple[dict[int, float], bool]:
    """(GiB the studio's process holds per GPU, whether it can give them back now); nothing
    without a studio, or when it cannot say (its memory then counts as a stranger's)."""
    if studio is None:
        return {}, False
    try:
        held = {int(k): float(v) for k, v in studio.held_gb().items() if v > 0}
        return held, bool(held) and studio.can_release()
    except Exception:  # a broken reader must not stop the queue
        return {}, False
