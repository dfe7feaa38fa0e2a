"""The SQLite job store: one row per job, the single source of truth for job state.

Each call opens its own short connection (WAL mode), so the UI's threads, the runner's monitor,
a restarted app and a second studio on the same data dir can all read and write the same file
safely. Starting a job is a claim (`claim`): one write transaction moves a queued job
to running and records which instance owns it, so two studios never start the same job."""
from __future__ import annotations

import enum
import errno
import json
import os
import sqlite3
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


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
    spec TEXT NOT NULL,
    owner TEXT NOT NULL DEFAULT ''
)
"""
# Columns added after the first release, with their definitions: added to older databases on open.
_MIGRATIONS = {"owner": "owner TEXT NOT NULL DEFAULT ''"}
_COLUMNS = ("id", "name", "state", "created_at", "started_at", "finished_at", "pid", "job_dir", "reason",
            "spec", "owner")
_UPDATABLE = {"state", "started_at", "finished_at", "pid", "reason", "owner"}


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
    owner: str = ""  # the runner instance that claimed it: "<host>:<pid>:<random>"

    def __post_init__(self) -> None:
        self.state = JobState(self.state)

    @property
    def finished(self) -> bool:
        return JobState(self.state).finished

    @property
    def active(self) -> bool:
        return JobState(self.state).active


# SQLite's words for a failing disk (SQLITE_FULL, SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_READONLY).
_DISK_MESSAGES = ("database or disk is full", "disk i/o error", "unable to open database file",
                  "attempt to write a readonly database")


def _disk_error(exc: sqlite3.Error, path: str) -> Exception:
    """A StorageError (the one-line message with the free space and the fix) for a disk failure, else `exc`."""
    text = str(exc).lower()
    if not any(mark in text for mark in _DISK_MESSAGES):
        return exc
    from jobs.io.storage import StorageError
    code = errno.ENOSPC if "full" in text else errno.EROFS if "readonly" in text else errno.EIO
    cause = OSError(code, os.strerror(code) if code != errno.EIO else f"SQLite: {exc}")
    if code == errno.EIO:  # SQLite says I/O error also when a full disk stops its -shm or -wal file
        from jobs.io.storage import LOW_SPACE_BYTES, free_bytes
        free = free_bytes(path)
        if free is not None and free < LOW_SPACE_BYTES:
            cause = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return StorageError(path, cause)


class _DiskAwareConnection(sqlite3.Connection):
    """A connection whose disk failures are StorageErrors. Every store call opens its own, so once
    space is free again the next call simply works: nothing stays broken in between."""

    def __init__(self, database, *args, **kwargs):
        try:
            super().__init__(database, *args, **kwargs)
        except sqlite3.Error as exc:
            raise _disk_error(exc, str(database)) from exc
        self._path = str(database)

    def execute(self, *args, **kwargs):
        try:
            return super().execute(*args, **kwargs)
        except sqlite3.Error as exc:
            raise _disk_error(exc, self._path) from exc

    def commit(self):
        try:
            return super().commit()
        except sqlite3.Error as exc:
            raise _disk_error(exc, self._path) from exc

    def __exit__(self, *exc_info):
        try:
            return super().__exit__(*exc_info)
        except sqlite3.Error as exc:
            raise _disk_error(exc, self._path) from exc


class JobStore:
    def __init__(self, db_path: str | Path):
        self.path = Path(db_path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.path.exists():  # private from the start; SQLite gives -wal/-shm the same mode
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        with closing(self._connect()) as conn, conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(_SCHEMA)
            present = {row["name"] for row in conn.execute("PRAGMA table_info(jobs)")}
            for column, definition in _MIGRATIONS.items():
                if column not in present:
                    _add_column(conn, definition)

    def _connect(self, autocommit: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None if autocommit else "",
                               factory=_DiskAwareConnection)
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

    def claim_next(self, owner: str, max_running: int) -> JobRecord | None:
        """Move the oldest queued job to running for `owner`, if fewer than `max_running` jobs run."""
        def oldest_if_room(running: list[JobRecord], queued: list[JobRecord]) -> str | None:
            return queued[0].id if queued and len(running) < max_running else None
        return self.claim(owner, oldest_if_room)

    def claim(self, owner: str, choose: Callable[[list[JobRecord], list[JobRecord]], str | None]) -> JobRecord | None:
        """Move the queued job that `choose(running, queued_oldest_first)` names (None: none) to
        running for `owner`, and return it.

        One IMMEDIATE transaction takes SQLite's write lock before `choose` sees the jobs, so two
        instances cannot both see the same free slot (or GPU) or both take the same job; `choose`
        should be quick and must not touch the store. The claimed job has no pid yet: its owner
        spawns the trainer next and records the pid with `set_pid`."""
        if not self.list(states=(JobState.QUEUED,)):
            return None  # the common case, without taking the write lock
        with closing(self._connect(autocommit=True)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                rows = conn.execute("SELECT * FROM jobs WHERE state IN (?, ?) ORDER BY created_at, id",
                                    (JobState.RUNNING.value, JobState.QUEUED.value)).fetchall()
                records = [_record(r) for r in rows]
                chosen = choose([r for r in records if r.state == JobState.RUNNING],
                                [r for r in records if r.state == JobState.QUEUED])
                if chosen is not None and conn.execute(
                        "UPDATE jobs SET state = ?, owner = ?, started_at = ?, pid = NULL WHERE id = ? AND state = ?",
                        (JobState.RUNNING.value, owner, time.time(), chosen, JobState.QUEUED.value)).rowcount != 1:
                    chosen = None  # not a queued job: nothing claimed
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return self.get(chosen) if chosen is not None else None

    def set_pid(self, job_id: str, owner: str, pid: int) -> bool:
        """Record the trainer's pid, only while `owner` still holds the running job."""
        with closing(self._connect()) as conn, conn:
            cur = conn.execute("UPDATE jobs SET pid = ? WHERE id = ? AND owner = ? AND state = ?",
                               (pid, job_id, owner, JobState.RUNNING.value))
            return cur.rowcount == 1

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


def _add_column(conn: sqlite3.Connection, definition: str) -> None:
    try:
        conn.execute(f"ALTER TABLE jobs ADD COLUMN {definition}")
    except sqlite3.OperationalError as exc:
        if "duplicate column" not in str(exc):  # another instance migrated it a moment ago
            raise


def _record(row: sqlite3.Row) -> JobRecord:
    """A row as a JobRecord; a damaged row (hand-edited, half-migrated) becomes a readable failed
    job instead of an exception that would break every page listing the jobs."""
    data = {k: row[k] for k in _COLUMNS}
    try:
        data["spec"] = json.loads(data["spec"])
        if not isinstance(data["spec"], dict):
            raise ValueError("not a mapping")
    except (TypeError, ValueError) as exc:
        print(f"[runner] job {data['id']}: unreadable spec in the database ({exc})", file=sys.stderr)
        data["spec"] = {}
    if data["state"] not in {s.value for s in JobState}:
        data["reason"] = f"unknown state {data['state']!r} in jobs.sqlite"
        data["state"] = JobState.FAILED
    data["owner"] = data["owner"] or ""
    data["reason"] = data["reason"] or ""
    return JobRecord(**data)
