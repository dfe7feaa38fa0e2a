"""(jobs/queue) Evaluations in the queue: `python -m jobs.evaluate` runs like a job (issue 39), so an
evaluation never lands on a GPU that a training job, or another evaluation, holds.

The design is the least new machinery: an evaluation is one more row in the job store, of kind
"evaluate" (its spec: {"kind": "evaluate", "job_id", "job", "name", "gpus", "processes": 0}), whose
folder is the evaluation's own, `<job>/evaluations/<name>/` (jobs/io/layout.py EvalLayout keeps its
config.yaml, events.jsonl and cancel.request where a job folder keeps them). So the runner does for it
what it does for a job, with the same code: the claim, the placement by jobs/io/gpus.py in order with
the queued jobs (a waiting one says on what, "waiting for a free GPU: GPU 0 is in use by job 'x'", and
keeps that GPU from later jobs), the Chat tab's models unloaded when it needs their room, cancel
(queued: it never starts; running: SIGTERM to its group, the CLI keeps the rows done) and the end read
from its events. What differs is in this module: its command (the evaluate CLI with --in-folder), its
log (evaluate.log), the GPU it got (written into its config's `gpus`, where `gpus.held_by_jobs` finds
it), how a cancelled one ended (cancelled, its rows kept), and that on a machine without GPUs it starts
at once, beside a training job, as it did before it was queued (it takes no `max_running` slot).
`Runner.list_jobs` leaves evaluations out: the Evaluate tab and Compare show them, never as jobs; a
job is deleted only with none of its evaluations running (queued ones are cancelled with it).

LlamaBoard likewise runs "Evaluate & Predict" through the same Runner as training (one process at a
time per page); here it is the studio's GPU-aware queue instead, shared by every page and job."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import yaml

from jobs.io import gpus
from jobs.io.layout import EvalLayout, JobLayout, new_eval_folder
from jobs.io.storage import as_storage_error, write_private_text
from jobs.messages import say
from jobs.queue.runner_log import RunnerError
from jobs.queue.store import ACTIVE, JobRecord, JobState, JobStore
from jobs.spec import SpecError

KIND = "evaluate"


def is_evaluation(record: JobRecord) -> bool:
    return (record.spec or {}).get("kind") == KIND


def add(store: JobStore, job_id: str, config: dict) -> JobRecord:
    """Queue an evaluation of the finished job `job_id`: its folder, its config.yaml (`config`: an
    EvalConfig mapping the caller validated, jobs/evaluate being above the queue), its row. Refused
    before anything exists: a RunnerError without such a job, a SpecError for a taken name or GPU
    this machine lacks; a StorageError (one line) when the folder cannot be written."""
    parent = store.get(job_id)
    if parent is None or is_evaluation(parent):
        raise RunnerError(say("eval_job_gone", job=job_id))
    gpus.check_request(str(config.get("gpus") or "auto"), 0, gpus.read_gpus())
    try:
        layout = new_eval_folder(parent.job_dir, str(config.get("name") or ""))
    except FileExistsError:
        raise SpecError("name", say("eval_name_taken", value=config.get("name"))) from None
    except OSError as exc:
        raise as_storage_error(exc, JobLayout(parent.job_dir).evaluations) from None
    config = {**config, "job": str(parent.job_dir), "name": layout.root.name}
    try:
        write_private_text(layout.config, yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=10_000))
    except OSError as exc:
        shutil.rmtree(layout.root, ignore_errors=True)
        raise as_storage_error(exc, layout.root) from None
    spec = {"kind": KIND, "job_id": parent.id, "job": str(parent.job_dir), "name": layout.root.name,
            "gpus": str(config.get("gpus") or "auto"), "processes": 0}
    return store.add(f"{parent.id}-eval-{layout.root.name}", say("eval_of_job", job=parent.name), layout.root,
                     spec)


def of_job(store: JobStore, job_id: str, states: tuple[str, ...] | None = None) -> list[JobRecord]:
    """The evaluations of job `job_id`, newest first."""
    return [r for r in store.list(states=states) if is_evaluation(r) and r.spec.get("job_id") == job_id]


def command(python: str, root: str | Path, data_dir: Path) -> list[str]:
    return [python, "-m", "jobs.evaluate", str(EvalLayout(root).config), "--data-dir", str(data_dir), "--in-folder"]


def log_file(record: JobRecord) -> Path:
    """Where the runner sends the process's output: an evaluation's evaluate.log (the CLI then writes
    its lines there only once), a job's train.log."""
    return EvalLayout(record.job_dir).log if is_evaluation(record) else JobLayout(record.job_dir).log


def record_gpu(root: str | Path, placed: gpus.Placement) -> None:
    """The GPU the evaluation got, as its config's `gpus` (the CLI keeps it; held_by_jobs reads it)."""
    config = EvalLayout(root).config
    data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    data["gpus"] = placed.gpus_key
    write_private_text(config, yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10_000))


def ended(record: JobRecord, final: dict | None, exit_text: str) -> tuple[JobState, str] | None:
    """How an evaluation ended, where it differs from a job: stopped early, it is cancelled with its
    rows kept (its last event is a done); silent (not cancelled before it could say), the log to read
    is evaluate.log."""
    if not is_evaluation(record):
        return None
    if final and final["type"] == "done" and final.get("cancelled"):
        return JobState.CANCELLED, say("eval_cancelled_kept", rows=final.get("rows", 0))
    if final is None and not EvalLayout(record.job_dir).cancel_request.exists():
        return JobState.FAILED, say("eval_ended_without_reason", exit=exit_text)
    return None


def before_job_deleted(store: JobStore, record: JobRecord) -> None:
    """Cancel the job's queued evaluations; refuse (RunnerError) while one runs: it reads the job's folder."""
    if is_evaluation(record):
        return
    for evaluation in of_job(store, record.id, ACTIVE):
        if not store.transition(evaluation.id, (JobState.QUEUED,), state=JobState.CANCELLED,
                                finished_at=time.time(), reason="removed before it started"):
            raise RunnerError(say("eval_job_busy", job=record.name))


def after_job_deleted(store: JobStore, record: JobRecord) -> None:
    """Forget the rows of a deleted job's evaluations (their folders went with the job's)."""
    if not is_evaluation(record):
        for evaluation in of_job(store, record.id):
            store.delete(evaluation.id, (JobState.DONE, JobState.FAILED, JobState.CANCELLED))
