"""The SQLite job store: one row per job, the single source of truth for job state.

Each call opens its own short connection (WAL mode), so the UI's threads, the runner's monitor
and a restarted app can all read and write the same file safely."""
from __future__ import annotations

import enum
import json
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class JobState(str, enum.Enum):
    """A job's life: queued -> running -> done | failed | cancelled (a queued job may be cancelled).

    A str enum, so a state compares equal to its SQLite text and JSON-encodes as that text."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        return self in FINISHED

    @property
    def active(self) -> bool:
        return self in ACTIVE


STATES = tuple(JobState)
FINISHED = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)
ACTIVE = (JobState.QUEUED, JobState.RUNNING)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    pid INTEGER,
    job_dir TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    spec TEXT NOT NULL
)
"""
_COLUMNS = ("id", "name", "state", "created_at", "started_at", "finished_at", "pid", "job_dir", "reason", "spec")
_UPDATABLE = {"state", "started_at", "finished_at", "pid", "reason"}


@dataclass
class JobRecord:
    id: str
    name: str
    state: str
    created_at: float
    job_dir: str
    spec: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None
    finished_at: float | None = None
    pid: int | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        self.state = JobState(self.state)

    @property
    def finished(self) -> bool:
        return JobState(self.state).finished

    @property
    def active(self) -> bool:
        return JobState(self.state).active


class JobStore:
    def __init__(self, db_path: str | Path):
        self.path = Path(db_path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as conn, conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30)
        conn.row_factory = sqlite3.Row
        return conn

    def add(self, job_id: str, name: str, job_dir: str | Path, spec: dict[str, Any],
            state: JobState = JobState.QUEUED) -> JobRecord:
        record = JobRecord(id=job_id, name=name, state=state, created_at=time.time(),
                           job_dir=str(job_dir), spec=dict(spec))
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "INSERT INTO jobs (id, name, state, created_at, job_dir, spec) VALUES (?, ?, ?, ?, ?, ?)",
                (record.id, record.name, record.state.value, record.created_at, record.job_dir,
                 json.dumps(record.spec)))
        return record

    def get(self, job_id: str) -> JobRecord | None:
        with closing(self._connect()) as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _record(row) if row else None

    def list(self, states: tuple[str, ...] | None = None) -> list[JobRecord]:
        """Jobs newest first, optionally only those in `states`."""
        query, args = "SELECT * FROM jobs", ()
        if states:
            query += f" WHERE state IN ({', '.join('?' for _ in states)})"
            args = tuple(JobState(s).value for s in states)
        with closing(self._connect()) as conn:
            rows = conn.execute(query + " ORDER BY created_at DESC, id DESC", args).fetchall()
        return [_record(r) for r in rows]

    def update(self, job_id: str, **fields: Any) -> None:
        bad = set(fields) - _UPDATABLE
        if bad:
            raise ValueError(f"cannot update {', '.join(sorted(bad))}")
        fields = _storable(fields)
        assignments = ", ".join(f"{k} = ?" for k in fields)
        with closing(self._connect()) as conn, conn:
            conn.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*fields.values(), job_id))

    def delete(self, job_id: str, from_states: tuple[str, ...]) -> bool:
        """Remove the row only if the job is in one of `from_states` (compare-and-delete)."""
        marks = ", ".join("?" for _ in from_states)
        with closing(self._connect()) as conn, conn:
            cur = conn.execute(f"DELETE FROM jobs WHERE id = ? AND state IN ({marks})",
                               (job_id, *(JobState(s).value for s in from_states)))
            return cur.rowcount == 1

    def transition(self, job_id: str, from_states: tuple[str, ...], **fields: Any) -> bool:
        """Update only if the job is still in one of `from_states` (a compare-and-set, so two
        watchers never both start or finish the same job). Returns whether it changed."""
        fields = _storable(fields)
        from_states = tuple(JobState(s).value for s in from_states)
        assignments = ", ".join(f"{k} = ?" for k in fields)
        marks = ", ".join("?" for _ in from_states)
        with closing(self._connect()) as conn, conn:
            cur = conn.execute(f"UPDATE jobs SET {assignments} WHERE id = ? AND state IN ({marks})",
                               (*fields.values(), job_id, *from_states))
            return cur.rowcount == 1


def _storable(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields as SQLite stores them: a state as its text (refusing unknown ones)."""
    if "state" in fields:
        try:
            fields = {**fields, "state": JobState(fields["state"]).value}
        except ValueError:
            raise ValueError(f"unknown state {fields['state']!r}") from None
    return fields


def _record(row: sqlite3.Row) -> JobRecord:
    data = {k: row[k] for k in _COLUMNS}
    data["spec"] = json.loads(data["spec"])
    return JobRecord(**data)
