"""A job on a Ray cluster, the command line's side: `python -m jobs.train CONFIG` with `cluster` set.

The job is submitted through the Ray Jobs API (`JobSubmissionClient`, what `ray job submit` uses) to
the dashboard address in `cluster`, so it outlives this process; its entrypoint
(`python -m jobs.train.ray_driver`, run on the cluster) trains as a Ray Train `TorchTrainer` across
`workers` workers (jobs/train/ray_worker.py). Here we follow the job's logs (printed, so that they
land in train.log as a local job's do), and exit with its status, as a local job does: the trainer's
own exit code (the driver exits with it), 130 when cancelled. The workers write events, checkpoints
and the adapter straight into the job folder, so it must be at the same path on every node.

Cancel: a SIGTERM (the runner's cancel) or Ctrl-C writes the folder's stop request, which every
worker watches; they agree on a step, save and exit like a local job's ranks. Only if they have not
ended after STOP_GRACE_S is the Ray job stopped outright (`stop_job`). (LLaMA-Factory's `USE_RAY=1`
and Axolotl run their trainers on Ray Train the same way; the Jobs API is Ray's own `ray job submit`.)

A dashboard with token authentication (Ray >= 2.52) gets the operator's token as the client's bearer
header (jobs/io/cluster_auth.py: FUSETUNE_CLUSTER_TOKEN, or Ray's own under RAY_AUTH_MODE=token), on
every request the client makes: submit, status, the log tail, stop. It is never put in the job's
runtime env, its config or its log.

Ray is optional (requirements-cluster.txt): it is imported here, in functions, only for a cluster job."""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from jobs.io.cluster_auth import auth_headers, token_refusal
from jobs.io.events import EventWriter, read_events
from jobs.io.layout import JobLayout
from jobs.io.storage import make_private_dir, write_private_text
from jobs.messages import say
from jobs.spec import JobSpec

EXIT_CONFIG, EXIT_FAILED, EXIT_CANCELLED = 2, 1, 130  # jobs/train/cli.py's exit codes
STOP_GRACE_S = 45.0   # the workers' time to save before the Ray job is stopped (the runner kills at 60 s)
LOST_CONTACT_S = 120.0  # the dashboard unreachable this long while following: the job is given up on
POLL_S = 1.0
REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "kernels")  # uploaded with the job (runtime_env py_modules): the cluster runs this code
# passed on to the driver and workers when set here (offline mode, thread counts, CPU Triton)
FORWARDED_ENV = ("OMP_NUM_THREADS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "TRITON_INTERPRET")
# RAY_TRAIN_ENABLE_PRINT_PATCH=0: Ray Train V2 also logs each print of a worker, so every line came twice
JOB_ENV = {"PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "PASSIVE", "TQDM_DISABLE": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def entrypoint(layout: JobLayout, data_dir: Path) -> str:
    """The shell command the Ray job runs on the cluster (the cluster's `python`, with our packages)."""
    return f"python -m jobs.train.ray_driver {shlex.quote(str(layout.config))} --data-dir {shlex.quote(str(data_dir))}"


def runtime_env(environ: dict) -> dict:
    env = {**JOB_ENV, **{k: environ[k] for k in FORWARDED_ENV if environ.get(k)}}
    return {"py_modules": [str(REPO_ROOT / name) for name in PACKAGES], "env_vars": env,
            "excludes": ["__pycache__", "*.pyc"]}


def submit_and_follow(spec: JobSpec, layout: JobLayout, data_dir: Path) -> int:
    """Submit the job in `layout` (its config written with absolute paths), follow it to its end and
    return its exit code; every refusal is one line on stderr and an error event."""
    try:
        import ray.job_submission  # noqa: F401 (is Ray installed here?)
    except ImportError:
        return _refuse(layout, say("ray_not_installed"), EXIT_CONFIG, "config")
    layout = JobLayout(layout.root.resolve())   # the workers see the folder by this path
    spec.output_dir = str(layout.root)
    write_private_text(layout.config, spec.to_yaml())
    layout.stop_workers.unlink(missing_ok=True)  # an old cancel's request must not stop this run
    make_private_dir(layout.ray)
    try:
        client = connect(spec.cluster)
        began = time.time()
        job_id = client.submit_job(entrypoint=entrypoint(layout, Path(data_dir).resolve()),
                                   submission_id=_submission_id(layout), runtime_env=runtime_env(dict(os.environ)),
                                   metadata={"fusetune_job": str(layout.root)})
    except Exception as exc:  # ConnectionError, RuntimeError from the dashboard, a refused runtime env
        return _refuse(layout, _unreachable(spec.cluster, exc), EXIT_FAILED, "config")
    write_private_text(layout.ray / "submission_id", job_id)
    print(f"fusetune: submitted Ray job {job_id} to {spec.cluster}: {spec.workers} worker(s), "
          f"{spec.gpus_per_worker} GPU(s) each; job folder {layout.root}", flush=True)
    cancelled = _follow(client, job_id, layout)
    return _outcome(client.get_job_info(job_id), layout, began, cancelled)


def connect(address: str):
    """A Jobs API client of the dashboard at `address`, sending the operator's token when there is one
    (without one, Ray's client still sends its own under RAY_AUTH_MODE=token)."""
    from ray.job_submission import JobSubmissionClient
    return JobSubmissionClient(address, headers=auth_headers(address) or None)


def _unreachable(address: str, exc: BaseException) -> str:
    """Why the dashboard refused the client: a token to set (Ray's AuthenticationError: a 401 or 403), else
    it could not be reached."""
    from ray.exceptions import AuthenticationError
    if isinstance(exc, AuthenticationError):
        return token_refusal(address, _first_line(exc))
    return say("cluster_unreachable", address=address, detail=_first_line(exc))


def _submission_id(layout: JobLayout) -> str:
    return f"fusetune-{re.sub(r'[^A-Za-z0-9_-]', '-', layout.root.name)[:40]}-{secrets.token_hex(3)}"


def _follow(client, job_id: str, layout: JobLayout) -> bool:
    """Print the job's logs until it ends; a SIGTERM/SIGINT meanwhile stops it with a checkpoint.
    Returns whether it was cancelled from here."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    tail = threading.Thread(target=_print_logs, args=(client, job_id), daemon=True, name="ray-job-logs")
    tail.start()
    asked_at, stopped, last_contact = None, False, time.monotonic()
    try:
        while True:
            try:
                if client.get_job_status(job_id).is_terminal():
                    break
                last_contact = time.monotonic()
            except Exception as exc:  # the dashboard restarting or the network: tried again
                if time.monotonic() - last_contact > LOST_CONTACT_S:
                    print(f"fusetune: lost contact with the Ray cluster: {_first_line(exc)}", file=sys.stderr)
                    break
            if stop.is_set() and asked_at is None:
                asked_at = time.monotonic()
                write_private_text(layout.stop_workers, str(time.time()))
                print("fusetune: stopping the Ray job: the workers save at the end of this step", flush=True)
            if asked_at is not None and not stopped and time.monotonic() - asked_at > STOP_GRACE_S:
                stopped = True
                with contextlib.suppress(Exception):
                    client.stop_job(job_id)
            time.sleep(POLL_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    tail.join(timeout=10)  # the last lines, after the job ended
    return asked_at is not None


def _print_logs(client, job_id: str) -> None:
    """The job's log as it grows (the Jobs API's websocket tail), without Ray's colour codes."""
    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            sys.stdout.write(ANSI.sub("", chunk))
            sys.stdout.flush()
    with contextlib.suppress(Exception):   # the job's status, not its log, decides the outcome
        asyncio.run(tail())


def _outcome(info, layout: JobLayout, began: float, cancelled: bool) -> int:
    """The exit code of a finished Ray job: the driver's (the trainer's own code), 130 for a cancel;
    a job that never trained (its runtime env failed, stopped on the cluster) gets its error event here."""
    from ray.job_submission import JobStatus
    code = info.driver_exit_code
    if info.status == JobStatus.SUCCEEDED:
        return 0
    if cancelled and (info.status == JobStatus.STOPPED or code == EXIT_CANCELLED):
        print("fusetune: cancelled; the adapter of the last step is saved", file=sys.stderr, flush=True)
        return EXIT_CANCELLED
    final = [e for e in read_events(layout.root) if e.get("time", 0) >= began and e.get("type") in ("error", "done")]
    if final and final[-1]["type"] == "error" and code:
        print(f"fusetune: {final[-1].get('message', '')}", file=sys.stderr, flush=True)
        return code
    message = say("ray_job_failed", job_id=info.submission_id, detail=_last_line(info.message or str(info.status)))
    kind = "killed" if info.status == JobStatus.STOPPED else "internal"
    EventWriter(layout.root).emit("error", kind=kind, message=message, step=_last_step(layout, began))
    print(f"fusetune: {message}", file=sys.stderr, flush=True)
    return EXIT_CANCELLED if kind == "killed" else (code or EXIT_FAILED)


def _refuse(layout: JobLayout, message: str, code: int, kind: str) -> int:
    with contextlib.suppress(OSError):
        EventWriter(layout.root).emit("error", kind=kind, message=message, step=0)
    print(f"fusetune: {message}", file=sys.stderr, flush=True)
    return code


def _last_step(layout: JobLayout, began: float) -> int:
    steps = [e["step"] for e in read_events(layout.root) if e.get("type") == "step" and e.get("time", 0) >= began]
    return steps[-1] if steps else 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:400] if lines else ""
