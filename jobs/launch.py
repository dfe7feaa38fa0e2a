"""`python -m jobs.launch [torchrun options] -m jobs.train CONFIG.yaml`: torchrun for a studio job.

The same launcher as `python -m torch.distributed.run` (its argument parser and elastic agent),
run in-process for two things torchrun does not do:

* The job's failure names the rank that caused it. When a rank dies (killed by the kernel's
  out-of-memory killer, a segfault, an exception), torchrun stops the others; their own errors
  (a lost peer, SIGTERM) would otherwise be the last word in events.jsonl. Here the root cause is
  picked from torchrun's failure report (a signal death before an error exit before a lost peer)
  and written as the job's final error event: the rank's own event again if it wrote one,
  otherwise "rank N was killed by SIGKILL ...".
* Cancel: the agent runs in a helper thread, so torchrun installs no signal handlers and a
  SIGTERM reaches only the ranks, which agree on a step, save and exit together (torchrun's own
  handler would kill them after a fixed grace period, in the middle of saving).

Nothing here imports torch until `main` runs (the runner imports `spec_launch_argv`)."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

# jobs.train's exit codes for a cancelled rank and a rank whose peers are gone
EXIT_CANCELLED, EXIT_PEER_LOST, EXIT_FAILED = 130, 4, 1
# how long torchrun lets the other ranks stop after one failed (they are usually blocked in a
# collective that will never finish, so a short wait is enough)
SHUTDOWN_TIMEOUT_S = "15"
OOM_HINT = (" (SIGKILL usually means the system ran out of memory and the kernel's OOM killer "
            "ended it: lower batch_size or max_seq_length, or use fewer processes)")


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def launched_by_torchrun(env: dict | None = None) -> bool:
    """Whether this process is one of torchrun's ranks."""
    env = os.environ if env is None else env
    return all(key in env for key in TORCHRUN_ENV)


def launch_argv(python: str, processes: int, nodes: int = 1, node_rank: int = 0, endpoint: str = "") -> list[str]:
    """The argv prefix that runs a module with `processes` ranks on this machine; the caller
    appends `-m jobs.train CONFIG.yaml ...`. One process: just the interpreter. Several machines
    (`nodes` > 1): this one's share of the job, meeting the others at node 0's `endpoint`."""
    if nodes > 1:
        # torchrun's static rendezvous (its --master-addr/--node-rank form): node_rank decides the ranks,
        # so node 0, at the endpoint, holds rank 0, which writes the job's files (c10d would number the
        # nodes in the order they arrive). Every node runs the same number of processes.
        return [python, "-m", "jobs.launch", "--nnodes", str(nodes), "--node-rank", str(node_rank),
                "--rdzv-backend", "static", "--rdzv-endpoint", endpoint,
                "--nproc-per-node", str(max(1, processes)), "--max-restarts", "0"]
    if processes <= 1:
        return [python]
    # --standalone: a private rendezvous on a free localhost port, so jobs on different GPUs
    # never collide; no restarts: a failed rank ends the job.
    return [python, "-m", "jobs.launch", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(processes), "--max-restarts", "0"]


def spec_launch_argv(python: str, processes: int, spec: dict) -> list[str]:
    """`launch_argv` for a job's spec (a JobSpec's dict): its rendezvous when it spans several machines."""
    return launch_argv(python, processes, int(spec.get("nodes", 1) or 1), int(spec.get("node_rank", 0) or 0),
                       str(spec.get("rdzv_endpoint", "") or ""))


def _priority(exitcode: int) -> int:
    """Lower is the likelier root cause: a signal death, an error exit, a lost peer, a cancelled
    rank, a rank stopped by SIGTERM/SIGINT. A cancelled rank comes before SIGTERM deaths: once one
    rank has stopped for a cancel, torchrun's agent SIGTERMs the rest, and a rank that is already
    past its handler (saved, exiting) dies of it; that is the cancel finishing, not a failure."""
    if exitcode in (-signal.SIGTERM, -signal.SIGINT):
        return 4
    if exitcode == EXIT_CANCELLED:
        return 3
    if exitcode == EXIT_PEER_LOST:
        return 2
    return 0 if exitcode < 0 else 1


def root_cause(failures: dict) -> tuple[int, object]:
    """(rank, failure) of torchrun's ChildFailedError.failures that most likely caused the rest."""
    return min(failures.items(), key=lambda kv: (_priority(kv[1].exitcode), kv[1].timestamp, kv[0]))


def failure_event(rank: int, failure, recent: list[dict]) -> dict | None:
    """The job's final error event after a failed launch, given the root-cause rank and the events
    the ranks wrote since the launch; None when nothing needs adding (a cancelled job, or the right
    error already last)."""
    if failure.exitcode == EXIT_CANCELLED:
        return None
    errors = [e for e in recent if e.get("type") == "error"]
    own = [e for e in errors if e.get("rank", 0) == rank]
    chosen = own[-1] if own else errors[0] if errors and failure.exitcode >= 0 else None
    if chosen is not None:
        return None if chosen is recent[-1] else {k: v for k, v in chosen.items() if k not in ("type", "time")}
    if failure.exitcode < 0:
        number = -failure.exitcode
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        hint = OOM_HINT if number == signal.SIGKILL else ""
        return {"kind": "killed", "rank": rank,
                "message": f"rank {rank} (pid {failure.pid}) was killed by {name}{hint}"}
    return {"kind": "internal", "rank": rank,
            "message": f"rank {rank} (pid {failure.pid}) exited with code {failure.exitcode} without "
                       "reporting why; see train.log"}


def _job_dir(args) -> Path | None:
    """The job folder of the trainer command torchrun runs (--output_dir, else from its config)."""
    rest = list(args.training_script_args)
    if "--output_dir" in rest[:-1]:
        return Path(rest[rest.index("--output_dir") + 1])
    configs = [a for a in rest if a.endswith((".yaml", ".yml"))]
    if not configs:
        return None
    from jobs.spec import JobSpec, SpecError
    try:
        output = JobSpec.from_yaml(configs[0]).output_dir
    except (OSError, SpecError):
        return None
    return Path(output) if output else None


def _report(job_dir: Path | None, rank: int, failure, began: float) -> None:
    from jobs.io.events import EventWriter, read_events
    if job_dir is None:
        return
    recent = [e for e in read_events(job_dir) if e.get("time", 0) >= began]
    event = failure_event(rank, failure, recent)
    if event is not None:
        EventWriter(job_dir).emit("error", **event)
        print(f"fusetune: {event['message']}", file=sys.stderr, flush=True)


def _report_launch_error(job_dir: Path | None, exc: BaseException) -> None:
    message = f"torchrun could not start the ranks: {type(exc).__name__}: {exc}"
    if job_dir is not None:
        from jobs.io.events import EventWriter
        EventWriter(job_dir).emit("error", kind="internal", message=message)
    print(f"fusetune: {message}", file=sys.stderr, flush=True)


def _forward_to_ranks(signum, _frame) -> None:
    """A signal sent to the launcher alone (not its process group) still reaches every rank."""
    import psutil
    for child in psutil.Process().children():
        try:
            child.send_signal(signum)
        except psutil.NoSuchProcess:
            pass


class _ExpectedWarnings(logging.Filter):
    """torchrun warns that it installs no signal handlers in a helper thread: that is the point."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "child thread" not in record.getMessage()


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_ExpectedWarnings())
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT_S)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    began, outcome = time.time(), {}

    def agent() -> None:
        try:
            run(args)
        except ChildFailedError as exc:
            outcome["failed"] = exc
        except BaseException as exc:  # rendezvous or launch errors: reported below, never lost
            outcome["error"] = exc

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _forward_to_ranks)
    thread = threading.Thread(target=agent, name="torchrun-agent", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    if "error" in outcome:
        _report_launch_error(_job_dir(args), outcome["error"])
        return EXIT_FAILED
    if "failed" not in outcome:
        return 0
    rank, failure = root_cause(outcome["failed"].failures)
    _report(_job_dir(args), rank, failure, began)
    return EXIT_CANCELLED if failure.exitcode == EXIT_CANCELLED else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
