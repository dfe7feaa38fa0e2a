"""Trainer processes as the runner sees them: who owns a job, is its trainer alive, signal its group.

A job's trainer may be a child of this runner (then `Popen.poll` reaps it), or of another studio
instance on the same data dir, or of a studio that has since restarted. Those are recognised by pid
and command line (the trainer's argv names `jobs.train` and the job's folder), so a recycled pid is
never mistaken for a trainer."""
from __future__ import annotations

import os
import secrets
import signal
import socket
from pathlib import Path

import psutil

from jobs.io import paths
from jobs.io.layout import CONFIG_FILE

HOST = socket.gethostname()


def new_owner() -> str:
    """An id for one runner instance: "<host>:<pid>:<random>" (two Runners in one process differ)."""
    return f"{HOST}:{os.getpid()}:{secrets.token_hex(3)}"


def owner_gone(owner: str) -> bool:
    """True when `owner` was a runner on this machine whose process no longer exists. Owners on
    other machines cannot be checked here (False)."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != HOST or not pid_text.isdigit():
        return False
    return not psutil.pid_exists(int(pid_text))


def is_trainer_of(pid: int | None, job_dir: str) -> bool:
    """True if `pid` is alive (not a zombie) and is this job's trainer (not a recycled pid)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return _names_job(proc.cmdline(), job_dir)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def find_trainer(job_dir: str) -> int | None:
    """The pid of a live trainer of `job_dir` that nobody recorded (its starter died right after
    spawning it), or None."""
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        info = proc.info
        if info["status"] != psutil.STATUS_ZOMBIE and _names_job(info["cmdline"] or [], job_dir):
            return info["pid"]
    return None


def _names_job(cmdline: list[str], job_dir: str) -> bool:
    # jobs.evaluate: an evaluation the queue runs (jobs/queue/evaluations.py), recognised as a trainer is.
    # Its folder lies inside its job's, so the folder's own config.yaml must be an argument, not a prefix.
    config = str(Path(job_dir) / CONFIG_FILE)
    return any("jobs.train" in part or "jobs.evaluate" in part for part in cmdline) and config in cmdline


def signal_group(pid: int | None, sig: int) -> None:
    """Send `sig` to the job's whole process group (the trainer leads its own session)."""
    if not pid:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "an unknown exit status"
    if code < 0 and -code in signal.valid_signals():
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def job_env(data_dir: Path, job_id: str) -> dict[str, str]:
    """The environment a job's process starts with (moved here from jobs/queue/runner.py, unchanged)."""
    # Progress bars are \r-animated lines: unreadable in a log file, so they are turned off.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FUSETUNE_JOB_ID": job_id,
           "FUSETUNE_HOME": str(data_dir), "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
    paths.cache_env(data_dir, env)
    env.pop("FUSETUNE_AUTH", None)  # the studio's password: no job needs it in its environment
    return env
