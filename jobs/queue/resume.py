"""(jobs/queue) Resume: the same job continues from its newest checkpoint with its own config.

A cancelled or failed job goes back to `queued` under its own id, folder and row; a done one can
"train more steps" (its max_steps raised). The trainer then loads `checkpoints/step-N` through the
ordinary `resume_from` path and appends to the job's events.jsonl; its start event carries
`resumed_at`, so the job keeps one loss curve (jobs.io.events.summarize drops what the earlier run
reported after that step). The same idea as `resume_from_checkpoint=True` in transformers'
Trainer (the newest checkpoint of the output dir), applied to the queue's job rather than to a new
run."""
from __future__ import annotations

import json
from pathlib import Path

from jobs.io.layout import TRAINER_STATE, JobLayout
from jobs.spec import JobSpec, SpecError
from jobs.io.storage import as_storage_error, write_private_text
from jobs.queue.store import JobRecord, JobState, JobStore

RESUMABLE = (JobState.CANCELLED, JobState.FAILED, JobState.DONE)


class ResumeError(RuntimeError):
    """Why a job cannot be resumed, for people (what to do instead)."""


def newest_checkpoint(job_dir: str | Path) -> tuple[Path, int] | None:
    """(folder, step) of the newest complete checkpoints/step-N, or None."""
    best: tuple[Path, int] | None = None
    for folder in JobLayout(job_dir).checkpoints.glob("step-*"):
        try:
            step = int(folder.name.split("-", 1)[1])
        except ValueError:
            continue
        trainer_state = folder / TRAINER_STATE
        if folder.is_dir() and trainer_state.is_file() and (best is None or step > best[1]):
            best = (folder, step)
    return best


def can_resume(record: JobRecord) -> bool:
    return JobState(record.state) in RESUMABLE and newest_checkpoint(record.job_dir) is not None


def resumed_spec(record: JobRecord, more_steps: int = 0) -> JobSpec:
    """The job's own config, set to continue from its newest checkpoint; a done job (or any job
    given more_steps) trains more_steps beyond that checkpoint."""
    state = JobState(record.state)
    if state not in RESUMABLE:
        raise ResumeError(f"job {record.name!r} is {state.value}: only a cancelled, failed or done job "
                          "can be resumed")
    found = newest_checkpoint(record.job_dir)
    if found is None:
        raise ResumeError(f"job {record.name!r} saved no checkpoint to resume from (save_steps writes one "
                          "every N steps, and Cancel writes one); start it again from the Train tab")
    folder, step = found
    # read without the start's file checks: its resume_from (the checkpoint the earlier run itself
    # started from) is replaced below and may be gone; the files the new run reads are checked last
    saved = {k: v for k, v in (record.spec or {}).items() if k in JobSpec.field_names()}
    spec = JobSpec.from_dict(saved, to_run=False)
    if state == JobState.DONE and more_steps <= 0:
        raise ResumeError(f"job {record.name!r} is done: say how many more steps to train")
    if more_steps > 0:  # beyond where the job ended (the newest checkpoint may be a little earlier)
        spec.max_steps = max(step, spec.max_steps) + more_steps
    spec.resume_from = str(folder)
    spec.validate()
    return spec


def requeue(store: JobStore, job_id: str, more_steps: int = 0) -> None:
    """Write the job's resumed config and put it back in the queue (a compare-and-set on its
    finished state, so two studios never resume it twice). The earlier run's cancel request is
    removed first: the runner would otherwise cancel the resumed run at once."""
    record = store.get(job_id)
    if record is None:
        raise ResumeError(f"there is no job {job_id}")
    try:
        spec = resumed_spec(record, more_steps)
    except SpecError as exc:
        raise ResumeError(f"job {record.name!r} cannot be resumed: {exc}") from None
    layout = JobLayout(record.job_dir)
    try:
        write_private_text(layout.config, spec.to_yaml())
        layout.cancel_request.unlink(missing_ok=True)
    except OSError as exc:
        raise ResumeError(str(as_storage_error(exc, layout.root))) from None
    if not store.transition(record.id, RESUMABLE, state=JobState.QUEUED, reason="", pid=None, owner="",
                            finished_at=None, started_at=None, spec=json.dumps(spec.to_dict())):
        raise ResumeError(f"job {record.name!r} changed state meanwhile; try again")
