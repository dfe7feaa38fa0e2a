"""(jobs/queue) How a job ended, in words: the final state and reason the runner records, and why
a trainer could not be started (moved out of jobs/queue/runner.py, unchanged, to keep it small)."""
from __future__ import annotations

from jobs.messages import say
from jobs.queue import evaluations, procs
from jobs.io.events import summarize
from jobs.io.layout import JobLayout
from jobs.io.storage import as_storage_error, is_disk_error
from jobs.queue.store import JobRecord, JobState


# the reason of a job whose cancel came after its last step: it ends "done", and says so
FINISHED_BEFORE_CANCEL = say("finished_before_cancel")


def spawn_failure(argv: list[str], layout: JobLayout, exc: BaseException) -> str:
    if is_disk_error(exc) and getattr(exc, "filename", None) == str(layout.log):
        return str(as_storage_error(exc, layout.log))
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return say("trainer_not_started", python=argv[0], detail=detail)


def outcome(record: JobRecord, code: int | None) -> tuple[JobState, str]:
    """The final state and a human reason, read from the job's own events first."""
    final = summarize(record.job_dir).final
    evaluation = evaluations.ended(record, final, procs.describe_exit(code))
    if evaluation is not None:   # an evaluation stopped early, or silent (jobs/queue/evaluations.py)
        return evaluation
    cancelled = JobLayout(record.job_dir).cancel_request.exists()
    if final and final["type"] == "done":  # a cancel that came after the last step changes nothing
        return JobState.DONE, FINISHED_BEFORE_CANCEL if cancelled else ""
    if cancelled:
        message = final.get("message", "") if final else ""
        return JobState.CANCELLED, message or "cancelled by the user"
    if final and final["type"] == "error":
        return JobState.FAILED, final.get("message", say("job_reported_error"))
    return JobState.FAILED, say("ended_without_reason", exit=procs.describe_exit(code))
