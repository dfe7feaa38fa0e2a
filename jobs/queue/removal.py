"""(jobs/queue) Deleting a job: its row and its folder, never a running job's, never a folder outside
<data dir>/jobs/, never one an export is reading, nor while an evaluation of it runs (an evaluation's
own row leaves its folder, which holds its results, in the job's)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from jobs.queue import evaluations
from jobs.queue.runner_log import RunnerError
from jobs.queue.store import FINISHED, JobState, JobStore


def delete_job(store: JobStore, jobs_dir: Path, job_id: str) -> bool:
    """Remove a job and its folder: a finished one, or a queued one (which is first cancelled so
    that no runner can claim it meanwhile). A running job is refused with a RunnerError: cancel
    it first. False when there is no such job. Only folders inside <data dir>/jobs/ are deleted
    (a row pointing elsewhere loses its row, never someone else's folder)."""
    record = store.get(job_id)
    if record is None:
        return False
    evaluations.before_job_deleted(store, record)   # its queued evaluations go; a running one refuses
    if record.state == JobState.QUEUED:
        store.transition(job_id, (JobState.QUEUED,), state=JobState.CANCELLED,
                      finished_at=time.time(), reason="removed before it started")
        record = store.get(job_id) or record
    if not record.finished:
        raise RunnerError(f"job {record.name!r} is running: cancel it first, then delete it")
    folder = Path(record.job_dir)
    trash = folder.with_name(f".deleting-{folder.name}")
    owned = folder.parent.resolve() == jobs_dir.resolve()
    if owned and folder.is_dir():
        from jobs.export.busy import ExportRunning, rename_unless_exporting
        try:
            rename_unless_exporting(folder, trash)  # gone from view at once; recoverable until rmtree
        except ExportRunning:
            raise RunnerError(f"job {record.name!r} is being exported right now: wait until the export "
                              "ends (the Export tab shows its progress), then delete it") from None
        except OSError as exc:
            raise RunnerError(f"cannot delete {folder}: {exc.strerror or exc}") from None
    if not store.delete(job_id, FINISHED):
        if owned and trash.is_dir():
            trash.rename(folder)
        raise RunnerError(f"job {record.name!r} changed state while being deleted; try again")
    shutil.rmtree(trash, ignore_errors=True)
    evaluations.after_job_deleted(store, record)
    return True

