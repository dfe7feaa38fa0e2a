"""What a user can do to one job, and the only place the studio calls the runner to change a job.

Every action names the job it acts on (the one the user picked; nothing here picks a job by
itself) and is confirmed in the page first (studio.jobs_tab). Messages are in the page language.

Runner calls (jobs.runner.Runner): ``cancel(job_id)`` stops a queued or running job;
``delete(job_id)`` removes a finished job's row and folder and raises ValueError, with a message,
for an active one.
"""
from __future__ import annotations

from typing import Any

from jobs.store import JobState
from studio.i18n import t

CANCEL, REMOVE, DELETE = "cancel", "remove", "delete"


def actions_for(record: Any | None) -> tuple[str, ...]:
    """The actions a job in this state offers: cancel a running job, remove a queued one, delete
    a finished one (with its folder)."""
    if record is None:
        return ()
    state = JobState(record.state)
    if state == JobState.RUNNING:
        return (CANCEL,)
    if state == JobState.QUEUED:
        return (REMOVE,)
    return (DELETE,)


def question(action: str, record: Any, lang: str) -> str:
    """The confirmation the page asks before `action` on `record`."""
    return t(f"confirm.{action}", lang, job=record.id, name=record.name, folder=record.job_dir)


def perform(runner: Any, action: str, job_id: str, lang: str) -> tuple[str, str]:
    """Run a confirmed action. Returns (level, message) for a notice: "ok", "warn" or "error".

    The job's state is read again first: between the question and the answer it may have moved
    on (a queued job started, a running one finished), and the action must still fit it.
    """
    record = runner.get(job_id)
    if record is None:
        return "warn", t("action.gone", lang, job=job_id)
    if action not in actions_for(record):
        return "warn", t("action.state_changed", lang, job=job_id, state=t(f"state.{JobState(record.state).value}", lang))
    if action == CANCEL:
        runner.cancel(job_id)
        return "ok", t("action.cancelling", lang, job=job_id)
    if action == REMOVE:
        return _remove_queued(runner, job_id, lang)
    try:
        runner.delete(job_id)
    except ValueError as exc:
        return "error", t("action.delete_refused", lang, job=job_id, error=str(exc))
    return "ok", t("action.deleted", lang, job=job_id)


def _remove_queued(runner: Any, job_id: str, lang: str) -> tuple[str, str]:
    """Cancel a queued job (it never starts), then delete its row and folder. If it started in
    the meantime, cancelling stops it instead, and the message says so."""
    runner.cancel(job_id)
    record = runner.get(job_id)
    if record is not None and record.active:
        return "warn", t("action.started_meanwhile", lang, job=job_id)
    try:
        runner.delete(job_id)
    except ValueError as exc:
        return "error", t("action.delete_refused", lang, job=job_id, error=str(exc))
    return "ok", t("action.removed", lang, job=job_id)
