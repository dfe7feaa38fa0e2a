"""What a user can do to one job, and the only place the studio calls the runner to change a job.

Every action names the job it acts on (the one the user picked; nothing here picks a job by
itself) and is confirmed in the page first (studio.jobs_tab). Messages are in the page language.

Runner calls (jobs.queue.runner.Runner, docs/contracts.md "Runner API"): ``cancel(job_id)`` stops a
running job; ``start_anyway(job_id)`` lets a job waiting for GPU memory start regardless;
``delete(job_id)`` removes a finished or queued job's row and folder, returns False
for an unknown job and raises RunnerError for a running one; ``resume(job_id, more_steps)`` queues
the same job again from its newest checkpoint (RunnerError says why it cannot).
"""
from __future__ import annotations

from typing import Any

from jobs.io.gpus import waits_for_memory
from jobs.queue.resume import can_resume, newest_checkpoint
from jobs.queue.runner import RunnerError
from jobs.queue.store import JobState
from studio.i18n import t
from studio.server_text import translated

CANCEL, REMOVE, DELETE, START_ANYWAY, RESUME, MORE = "cancel", "remove", "delete", "start_anyway", "resume", "more"


def actions_for(record: Any | None) -> tuple[str, ...]:
    """The actions a job in this state offers: cancel a running job, remove a queued one (and
    start it anyway while it waits for GPU memory), delete a finished one (with its folder)."""
    if record is None:
        return ()
    state = JobState(record.state)
    if state == JobState.RUNNING:
        return (CANCEL,)
    if state == JobState.QUEUED:
        return (REMOVE, START_ANYWAY) if waits_for_memory(record.reason) else (REMOVE,)
    if not can_resume(record):  # a job that saved no checkpoint can only be started again
        return (DELETE,)
    return (MORE, DELETE) if state == JobState.DONE else (RESUME, DELETE)


def question(action: str, record: Any, lang: str) -> str:
    """The confirmation the page asks before `action` on `record`."""
    found = newest_checkpoint(record.job_dir) if action in (RESUME, MORE) else None
    return t(f"confirm.{action}", lang, job=record.id, name=record.name, folder=record.job_dir,
             step=found[1] if found else 0)


def default_more_steps(record: Any) -> int:
    """What "train more steps" offers first: as many steps again as the job ran."""
    return max(1, int((record.spec or {}).get("max_steps") or 0) or 50)


def perform(runner: Any, action: str, job_id: str, lang: str, more_steps: int = 0) -> tuple[str, str]:
    """Run a confirmed action. Returns (level, message) for a notice: "ok", "warn" or "error".

    The job's state is read again first: between the question and the answer it may have moved
    on (a queued job started, a running one finished), and the action must still fit it.
    """
    record = runner.get(job_id)
    if record is None:
        return "warn", t("action.gone", lang, job=job_id)
    if action not in actions_for(record):
        state = t(f"state.{JobState(record.state).value}", lang)
        return "warn", t("action.state_changed", lang, job=job_id, state=state)
    if action == CANCEL:
        runner.cancel(job_id)
        return "ok", t("action.cancelling", lang, job=job_id)
    if action == START_ANYWAY:
        if not runner.start_anyway(job_id):
            return "warn", t("action.gone", lang, job=job_id)
        return "ok", t("action.starting_anyway", lang, job=job_id)
    if action in (RESUME, MORE):
        return _resume(runner, action, job_id, lang, more_steps)
    try:
        removed = runner.delete(job_id)  # a queued job is cancelled first, so it cannot start meanwhile
    except RunnerError as exc:  # it started (or changed) at the last moment
        return "error", t("action.delete_refused", lang, job=job_id, error=translated(str(exc), lang))
    if not removed:
        return "warn", t("action.gone", lang, job=job_id)
    return "ok", t("action.removed" if action == REMOVE else "action.deleted", lang, job=job_id)


def _resume(runner: Any, action: str, job_id: str, lang: str, more_steps: int) -> tuple[str, str]:
    more = int(more_steps or 0) if action == MORE else 0
    if action == MORE and more < 1:
        return "warn", t("action.more_steps_needed", lang)
    record = runner.get(job_id)
    found = newest_checkpoint(record.job_dir) if record else None
    try:
        if action == MORE:   # a new job in its own folder: the done job's adapter stays as it was
            again = runner.train_more(job_id, more)
        else:
            runner.resume(job_id)
    except RunnerError as exc:
        return "error", t("action.resume_refused", lang, job=job_id, error=translated(str(exc), lang))
    step = found[1] if found else 0
    if action == MORE:
        return "ok", t("action.continued", lang, job=job_id, new=again.id, name=again.name, step=step)
    return "ok", t("action.resumed", lang, job=job_id, step=step)
