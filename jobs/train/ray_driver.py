"""`python -m jobs.train.ray_driver CONFIG.yaml --data-dir DIR`: a cluster job's entrypoint, which the
Ray Jobs API runs on the cluster (jobs/train/cluster.py submits it).

It trains the job as a Ray Train `TorchTrainer` (Ray Train V2) of `workers` workers, one CPU each and
`gpus_per_worker` GPUs, spread over the nodes; each worker is one rank of the trainer
(jobs/train/ray_worker.py), data parallel with gloo on CPUs and NCCL on GPUs. No Ray restarts: a
failed worker fails the job, whose last checkpoint stays for a resume. The driver's exit code is
the job's (the trainer's codes: 0, 2 config, 3 data, 5 disk, 1 other, 130 cancelled); a worker
that died (killed, its node lost) is named with its node in the job's last error event."""
from __future__ import annotations

import os
import signal
import sys
import time
from types import SimpleNamespace

from jobs import launch
from jobs.errors import SpecError
from jobs.io.events import EventWriter, read_events
from jobs.io.layout import JobLayout
from jobs.io.storage import PRIVATE_UMASK, write_private_text
from jobs.messages import say
from jobs.train import cli
from jobs.train.distributed import COLLECTIVE_TIMEOUT
from jobs.train.ray_worker import read_records, train_worker

EXIT_CONFIG, EXIT_FAILED, EXIT_CANCELLED = 2, 1, 130


def too_small(spec, resources: dict) -> str | None:
    """Why the cluster (its nodes up now) cannot hold the job's workers at all, or None."""
    needs = [("CPU", "CPUs", spec.workers, 1)]
    if spec.gpus_per_worker:
        needs.append(("GPU", "GPUs", spec.workers * spec.gpus_per_worker, spec.gpus_per_worker))
    for key, name, need, each in needs:
        have = int(resources.get(key, 0))
        if have < need:
            return say("cluster_too_small", have=have, resource=name, need=need, per_worker=f"{each} {name}")
    return None


def make_trainer(spec, argv: list[str], layout: JobLayout):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    gpu = spec.gpus_per_worker > 0
    resources = {"CPU": 1, **({"GPU": spec.gpus_per_worker} if gpu else {})}
    return TorchTrainer(
        train_worker, train_loop_config={"argv": argv},
        scaling_config=ScalingConfig(num_workers=spec.workers, use_gpu=gpu, resources_per_worker=resources,
                                     placement_strategy="SPREAD"),
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo",
                                 timeout_s=int(COLLECTIVE_TIMEOUT.total_seconds())),
        run_config=RunConfig(name="train", storage_path=str(layout.ray), failure_config=FailureConfig(max_failures=0)))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.umask(PRIVATE_UMASK)
    try:
        spec, _ = cli.parse(argv)
    except SpecError as exc:
        print(f"fusetune: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    layout = JobLayout(spec.output_dir)
    import ray
    ray.init()  # the cluster this job runs on (RAY_ADDRESS, set by the Jobs API)
    problem = too_small(spec, ray.cluster_resources())
    if problem:
        return _fail(layout, problem, EXIT_CONFIG, "config")
    for old in layout.ray.glob("worker-*.json"):  # an earlier run's (a resumed job)
        old.unlink(missing_ok=True)
    # `ray job stop` from elsewhere: the workers save if Ray waits long enough (RAY_JOB_STOP_WAIT_TIME_S)
    signal.signal(signal.SIGTERM, lambda *_: write_private_text(layout.stop_workers, str(time.time())))
    began = time.time()
    try:
        make_trainer(spec, argv, layout).fit()
        failure = None
    except Exception as exc:  # Ray Train's TrainingFailedError (a worker's), or Ray's own
        failure = exc
    return verdict(layout, failure, began)


def verdict(layout: JobLayout, failure: BaseException | None, began: float) -> int:
    """The job's exit code from each worker's record (and Ray's failure): a dead worker first (named
    with its node), then the root cause among the ranks' exit codes as for torchrun (jobs/launch.py)."""
    records = read_records(layout)
    if failure is None:
        return EXIT_CANCELLED if any(r.get("code") == EXIT_CANCELLED for r in records.values()) else 0
    failed = dict(getattr(failure, "worker_failures", None) or {})
    dead = [rank for rank in sorted(failed or records) if "code" not in records.get(rank, {})]
    if dead:
        rank, record = dead[0], records.get(dead[0], {})
        detail = _first_line(failed.get(rank, failure))
        message = say("worker_died", rank=rank, pid=record.get("pid", "?"), node=_node(record),
                      step=_last_step(layout, began), detail=detail)
        return _fail(layout, message, EXIT_FAILED, "killed", rank=rank)
    exits = {rank: SimpleNamespace(exitcode=r["code"], timestamp=r.get("ended", 0), pid=r.get("pid"))
             for rank, r in records.items() if r.get("code")}
    if not exits:  # no worker trained: Ray itself failed (placement, the controller)
        job = os.environ.get("RAY_JOB_SUBMISSION_ID", "")
        return _fail(layout, say("ray_job_failed", job_id=job, detail=_first_line(failure)), EXIT_FAILED, "internal")
    rank, cause = launch.root_cause(exits)
    event = launch.failure_event(rank, cause, [e for e in read_events(layout.root) if e.get("time", 0) >= began])
    if event is not None:
        EventWriter(layout.root).emit("error", **event)
        print(f"fusetune: {event['message']}", file=sys.stderr, flush=True)
    return cause.exitcode if cause.exitcode > 0 else EXIT_FAILED


def _fail(layout: JobLayout, message: str, code: int, kind: str, **extra) -> int:
    EventWriter(layout.root).emit("error", kind=kind, message=message, step=_last_step(layout, 0), **extra)
    print(f"fusetune: {message}", file=sys.stderr, flush=True)
    return code


def _node(record: dict) -> str:
    if not record:
        return "unknown (it never started)"
    return f"{record.get('host')} ({record.get('node_ip')}, Ray node {str(record.get('node_id'))[:12]})"


def _last_step(layout: JobLayout, began: float) -> int:
    steps = [e["step"] for e in read_events(layout.root) if e.get("type") == "step" and e.get("time", 0) >= began]
    return steps[-1] if steps else 0


def _first_line(exc: BaseException) -> str:
    exc = getattr(exc, "cause", None) or exc  # a RayTaskError: the worker's own exception
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


if __name__ == "__main__":
    sys.exit(main())
