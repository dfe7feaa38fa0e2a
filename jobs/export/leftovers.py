"""What a killed export leaves behind, removed at the studio's start (and after a cancelled export).

An export writes under hidden temporary names (jobs/export/files.py): `.<name>.partial-<pid>` (a
file or a folder), `.<name>.old-<pid>` (the previous export set aside for a moment), and the Export
tab's `.<folder>.zip.partial`. A SIGKILL leaves them where they are. They are removed from a job's
folder, its exports/ and each export folder in it, but only while nothing exports that job: the
job's export lock (jobs/export/busy.py) is taken exclusively without waiting, so an export running
from a terminal or another studio keeps its files. The trainer's own `.adapter.partial` and
`.step-N.partial` (no pid) are not an export's and are never touched here."""
from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

from jobs.export.files import remove_empty, remove_path
from jobs.io.layout import JobLayout

LEFTOVER = re.compile(r"^\..+\.(partial|old)-\d+$|^\..+\.zip\.partial$")


def _candidates(job_dir: Path, pid: int | None) -> list[Path]:
    exports = JobLayout(job_dir).exports
    folders = [job_dir, exports, *(p for p in exports.glob("*") if p.is_dir() and not p.is_symlink())] \
        if exports.is_dir() else [job_dir]
    found = []
    for folder in folders:
        for path in folder.glob(".*"):
            if LEFTOVER.match(path.name) and (pid is None or path.name.endswith(f"-{pid}")):
                found.append(path)
    return found


def remove_job_leftovers(job_dir: str | Path, pid: int | None = None) -> list[Path]:
    """Remove a job's export leftovers; [] while an export of the job runs. With `pid` (an export
    process that has ended), only that process's, whatever else runs. Returns what was removed."""
    job_dir = Path(job_dir)
    if pid is not None:
        return _remove_all(job_dir, _candidates(job_dir, pid))
    try:
        fd = os.open(JobLayout(job_dir).export_lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return []
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []   # an export of this job is running: its temporary files are in use
        return _remove_all(job_dir, _candidates(job_dir, None))
    finally:
        os.close(fd)


def _remove_all(job_dir: Path, paths: list[Path]) -> list[Path]:
    """Remove `paths`, then exports/ when that leaves it empty (the export had made it)."""
    for path in paths:
        remove_path(path)
    if paths:
        remove_empty([JobLayout(job_dir).exports])
    return paths


def remove_leftovers(jobs_root: str | Path) -> list[Path]:
    """Every job's export leftovers under `jobs_root` (the data dir's jobs/), at the studio's start."""
    root = Path(jobs_root)
    if not root.is_dir():
        return []
    removed: list[Path] = []
    for job_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        removed += remove_job_leftovers(job_dir)
    return removed
