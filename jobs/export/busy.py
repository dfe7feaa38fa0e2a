"""A job's exports and its deletion exclude each other through one lock file in the job folder.

Every export (the CLI, and so the Export tab; several at once are fine) holds a shared flock on
`<job>/.export.lock` while it runs; `Runner.delete` takes it exclusively without waiting, so a job
is never deleted from under an export that is still writing into its folder, and the user is told
why. A flock dies with its process, so an export that was killed never blocks a later delete."""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from jobs.io.layout import JobLayout


class ExportRunning(Exception):
    """The job is being exported right now."""


def _open_lock(job_dir: Path) -> int | None:
    try:
        return os.open(JobLayout(job_dir).export_lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:  # no folder (the export then fails with its own message), or a read-only one
        return None


@contextmanager
def exporting(job_dir: str | Path) -> Iterator[None]:
    """Hold the job's export lock (shared) for the duration of one export."""
    fd = _open_lock(Path(job_dir))
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def rename_unless_exporting(job_dir: Path, target: Path) -> None:
    """Rename the job folder while holding its export lock exclusively; ExportRunning at once (and
    nothing renamed) when an export holds it. An export starting after the rename finds no folder."""
    fd = _open_lock(job_dir)
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ExportRunning(str(job_dir)) from None
        job_dir.rename(target)
    finally:
        if fd is not None:
            os.close(fd)
