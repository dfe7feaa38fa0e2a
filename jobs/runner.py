"""The job runner: starts each job as `python -m jobs.train <job dir>/config.yaml`.

No shell, its own process group (so cancel reaches every child), stdout and stderr appended to
train.log (never a pipe the UI must drain). Jobs outlive the UI: a restarted runner finds running
jobs by pid and keeps watching them. One job runs at a time (they share the GPU); the rest queue.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from jobs import paths
from jobs.events import summarize
from jobs.layout import JobLayout
from jobs.spec import JobSpec, short_name
from jobs.store import JobRecord, JobState, JobStore

REPO_ROOT = Path(__file__).resolve().parents[1]
CANCEL_GRACE_S = 60.0


class Runner:
    def __init__(self, data_dir: str | Path, python: str | None = None, max_running: int = 1):
        self.data_dir = paths.data_dir(data_dir)
        self.store = JobStore(self.data_dir / "jobs.sqlite")
        self.python = python or sys.executable
        self.max_running = max_running
        self._children: dict[str, subprocess.Popen] = {}
        self._lock = threading.RLock()
        self._monitor: threading.Thread | None = None
        self._stop = threading.Event()

    # ---- what the UI calls ----------------------------------------------------------------
    def preview_command(self, spec: JobSpec) -> tuple[str, list[str]]:
        """The YAML and argv that Start would run, without creating anything."""
        return spec.to_yaml(), self.command(JobLayout(spec.output_dir or "<job dir>"))

    def command(self, layout: JobLayout) -> list[str]:
        """The trainer's argv for a job folder (the only place it is built)."""
        return [self.python, "-m", "jobs.train", str(layout.config)]

    def submit(self, spec: JobSpec) -> JobRecord:
        """Validate, record and start (or queue) a job. Raises SpecError before anything exists."""
        spec.validate()
        job_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
        job_dir = paths.jobs_dir(self.data_dir) / job_id
        spec.output_dir = str(job_dir)
        spec.write_yaml(JobLayout(job_dir).config)
        record = self.store.add(job_id, _job_name(spec), job_dir, spec.to_dict())
        self.reconcile()
        return self.store.get(job_id) or record

    def cancel(self, job_id: str) -> None:
        """Stop a job: a queued one never starts; a running one gets SIGTERM, saves the adapter of
        its current step and exits; after a grace period its whole process group is killed."""
        record = self.store.get(job_id)
        if record is None or record.finished:
            return
        if self.store.transition(job_id, (JobState.QUEUED,), state=JobState.CANCELLED, finished_at=time.time(),
                                 reason="cancelled before it started"):
            return
        JobLayout(record.job_dir).cancel_request.write_text(str(time.time()))
        _signal_group(record.pid, signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, args=(record,), daemon=True).start()

    def delete(self, job_id: str) -> None:
        """Remove a finished job: its row and its folder. Raises ValueError for an unknown or
        active job (cancel it first)."""
        record = self.store.get(job_id)
        if record is None:
            raise ValueError(f"there is no job {job_id}")
        if not self.store.delete(job_id, (JobState.DONE, JobState.FAILED, JobState.CANCELLED)):
            raise ValueError(f"job {job_id} is {self.store.get(job_id).state}: cancel it first")
        shutil.rmtree(record.job_dir, ignore_errors=True)

    def list_jobs(self) -> list[JobRecord]:
        self.reconcile()
        return self.store.list()

    def get(self, job_id: str) -> JobRecord | None:
        self.reconcile()
        return self.store.get(job_id)

    # ---- the watcher ----------------------------------------------------------------------
    def start_monitor(self, interval_s: float = 1.0) -> None:
        """Watch jobs in the background so queued jobs start with no browser connected."""
        if self._monitor and self._monitor.is_alive():
            return
        self._stop.clear()
        self._monitor = threading.Thread(target=self._watch, args=(interval_s,), daemon=True,
                                         name="fusetune-runner")
        self._monitor.start()

    def shutdown(self) -> None:
        """Stop watching. Running jobs keep running; a new Runner reattaches to them."""
        self._stop.set()
        if self._monitor:
            self._monitor.join(timeout=5)

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.reconcile()

    def reconcile(self) -> None:
        """Finish jobs whose process has exited, then start queued jobs while there is room."""
        with self._lock:
            for record in self.store.list(states=(JobState.RUNNING,)):
                if not self._alive(record):
                    self._finish(record)
            running = len(self.store.list(states=(JobState.RUNNING,)))
            for record in reversed(self.store.list(states=(JobState.QUEUED,))):  # oldest first
                if running >= self.max_running:
                    break
                self._start(record)
                running += 1

    def _start(self, record: JobRecord) -> None:
        layout = JobLayout(record.job_dir)
        argv = self.command(layout)
        # Progress bars are \r-animated lines: unreadable in a log file, so they are turned off.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "FUSETUNE_JOB_ID": record.id,
               "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
        with open(layout.log, "ab") as log:
            proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._children[record.id] = proc
        self.store.transition(record.id, (JobState.QUEUED,), state=JobState.RUNNING, pid=proc.pid, started_at=time.time())

    def _alive(self, record: JobRecord) -> bool:
        child = self._children.get(record.id)
        if child is not None:
            return child.poll() is None
        return _is_our_trainer(record.pid, record.job_dir)

    def _finish(self, record: JobRecord) -> None:
        child = self._children.pop(record.id, None)
        code = child.returncode if child is not None else None
        _signal_group(record.pid, signal.SIGKILL)  # sweep any grandchildren the job left behind
        state, reason = _outcome(record, code)
        self.store.transition(record.id, (JobState.RUNNING,), state=state, reason=reason, finished_at=time.time())

    def _kill_after_grace(self, record: JobRecord) -> None:
        deadline = time.time() + CANCEL_GRACE_S
        while time.time() < deadline:
            if not self._alive(record):
                break
            time.sleep(0.5)
        else:
            _signal_group(record.pid, signal.SIGKILL)
        self.reconcile()


def _job_name(spec: JobSpec) -> str:
    if spec.name.strip():
        return spec.name.strip()
    return f"{short_name(spec.model)} · {short_name(spec.dataset)}"


def _outcome(record: JobRecord, code: int | None) -> tuple[JobState, str]:
    """The final state and a human reason, read from the job's own events first."""
    final = summarize(record.job_dir).final
    cancelled = JobLayout(record.job_dir).cancel_request.exists()
    if final and final["type"] == "done":
        return JobState.DONE, ""
    if cancelled:
        message = final.get("message", "") if final else ""
        return JobState.CANCELLED, message or "cancelled by the user"
    if final and final["type"] == "error":
        return JobState.FAILED, final.get("message", "the job reported an error")
    how = f"exit code {code}" if code is not None else "an unknown exit status"
    if code is not None and code < 0:
        how = f"signal {signal.Signals(-code).name}" if -code in signal.valid_signals() else how
    return JobState.FAILED, f"the training process ended with {how} without reporting why; see train.log"


def _signal_group(pid: int | None, sig: int) -> None:
    if not pid:
        return
    try:
        os.killpg(pid, sig)  # the job leads its own session, so its pgid is its pid
    except (ProcessLookupError, PermissionError):
        pass


def _is_our_trainer(pid: int | None, job_dir: str) -> bool:
    """True if `pid` is alive and is this job's trainer (not a recycled pid)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return any("jobs.train" in part for part in proc.cmdline()) and any(
            str(job_dir) in part for part in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
