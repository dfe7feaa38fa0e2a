"""(jobs/queue) Resume and "train more steps".

Resume: a cancelled or failed job goes back to `queued` under its own id, folder and row. The
trainer loads `checkpoints/step-N` through the ordinary `resume_from` path and appends to the job's
events.jsonl; its start event carries `resumed_at`, so the job keeps one loss curve
(jobs.io.events.summarize drops what the earlier run reported after that step). The same idea as
`resume_from_checkpoint=True` in transformers' Trainer, applied to the queue's job.

Train more steps: a done job is never touched again (its adapter, exports and chat answers stay
what they were). A new job, in a folder of its own, starts from the done job's final checkpoint
(the trainer always writes one at the end, jobs/train/saving.finish); its folder starts with a copy
of the first job's events, so its step count and loss curve continue where the first ended, and
`continues.json` links it to the first."""
from __future__ import annotations

import json
from pathlib import Path

from jobs.io.events import read_events
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
    spec = _saved_spec(record)
    if state == JobState.DONE and more_steps <= 0:
        raise ResumeError(f"job {record.name!r} is done: say how many more steps to train")
    if more_steps > 0:  # beyond where the job ended (the newest checkpoint may be a little earlier)
        spec.max_steps = max(step, spec.max_steps) + more_steps
    spec.resume_from = str(folder)
    spec.validate()
    return spec


def _saved_spec(record: JobRecord) -> JobSpec:
    """The job's own config, read without the start's file checks: its resume_from (the checkpoint
    the earlier run itself started from) is replaced by the caller and may be gone; the files the
    new run reads are checked by the caller's validate()."""
    saved = {k: v for k, v in (record.spec or {}).items() if k in JobSpec.field_names()}
    return JobSpec.from_dict(saved, to_run=False)


def continued_spec(record: JobRecord, more_steps: int) -> tuple[JobSpec, int]:
    """The config of a new job that trains `more_steps` beyond where the done job `record` ended,
    from its newest checkpoint; and that checkpoint's step."""
    if JobState(record.state) != JobState.DONE:
        raise ResumeError(f"job {record.name!r} is not done: resume it instead of training more steps")
    if more_steps <= 0:
        raise ResumeError(f"job {record.name!r} is done: say how many more steps to train")
    found = newest_checkpoint(record.job_dir)
    if found is None:
        raise ResumeError(f"job {record.name!r} saved no checkpoint to continue from; start a new job "
                          "from the Train tab")
    folder, step = found
    spec = _saved_spec(record)
    spec.max_steps = max(step, spec.max_steps) + more_steps
    spec.resume_from = str(folder)
    spec.name = f"{record.name} +{more_steps}"
    spec.output_dir = ""
    spec.validate()
    return spec, step


def seed_continuation(layout: JobLayout, parent: JobRecord, step: int) -> None:
    """Start a continuing job's folder with the first job's events (so that its curve and step count
    go on from `step`) and the link to that job. Checkpoint events are left out: they name the first
    job's folders, not this one's."""
    events = []
    for event in read_events(parent.job_dir):
        if event.get("type") != "checkpoint":
            events.append(json.dumps(event, ensure_ascii=False) + "\n")
    write_private_text(layout.events, "".join(events))
    link = {"job_id": parent.id, "name": parent.name, "job_dir": str(parent.job_dir), "step": step}
    write_private_text(layout.continues, json.dumps(link, ensure_ascii=False))


def continued_from(job_dir: str | Path) -> dict | None:
    """The link a "train more steps" job keeps to the job it continues ({job_id, name, step}), or None."""
    try:
        link = json.loads(JobLayout(job_dir).continues.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return link if isinstance(link, dict) and isinstance(link.get("step"), int) else None


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
