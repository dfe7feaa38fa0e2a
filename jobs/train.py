"""`python -m jobs.train CONFIG.yaml [--key value ...]`: run one training job headless.

Exactly what the studio's Start button runs. Exit 0 on success; otherwise non-zero with a one-line
reason on stderr, an `error` event (with a `kind`) in events.jsonl, and the log and last
checkpoint left in the output dir. Any JobSpec field can be overridden on the command line."""
from __future__ import annotations

import os

# torch and bitsandbytes' CPU library each bring an OpenMP runtime; with the default busy-wait
# policy their two thread pools spin against each other and CPU training slows down up to 100x.
# Must be set before torch loads. (Found measuring a 135M run on 2 cores: 160 -> 3 tokens/s.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import dataclasses
import logging
import signal
import sys
import time
import traceback
from pathlib import Path

from jobs.launch import EXIT_PEER_LOST
from jobs.layout import JobLayout
from jobs.spec import JobSpec, SpecError, short_name

EXIT_CONFIG, EXIT_DATA, EXIT_FAILED, EXIT_CANCELLED = 2, 3, 1, 130
# Errors every rank meets alike (the same data, config, loss): reported once, by rank 0.
SHARED_ERROR_KINDS = ("data", "config", "nan")


def build_parser() -> argparse.ArgumentParser:
    """The CLI, generated from JobSpec so it cannot drift from the UI form or the YAML."""
    parser = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", help="a YAML file with JobSpec keys (see README)")
    for f in dataclasses.fields(JobSpec):
        parser.add_argument(f"--{f.name}", dest=f.name, default=None, metavar=f.type.upper(),
                            help=f.metadata.get("help", ""))
    return parser


def load_spec(argv: list[str] | None) -> JobSpec:
    args = vars(build_parser().parse_args(argv))
    config = args.pop("config")
    data = {}
    if config:
        import yaml
        path = Path(config)
        if not path.is_file():
            raise SpecError(None, f"config file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise SpecError(None, f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise SpecError(None, f"{path} must be one flat mapping of key: value pairs")
    data.update({k: v for k, v in args.items() if v is not None})
    return JobSpec.from_dict(data)


def _default_output_dir(spec: JobSpec) -> str:
    return str(Path("outputs") / f"{short_name(spec.model)}-{time.strftime('%Y%m%d-%H%M%S')}")


def _classify(exc: BaseException) -> tuple[str, int]:
    """The error event's kind and the exit code for a failure."""
    import torch
    from jobs.data import DataError
    from jobs.models import ModelError
    from jobs.trainer import Cancelled, NonFiniteLoss
    if isinstance(exc, Cancelled):
        return "killed", EXIT_CANCELLED
    if isinstance(exc, DataError):
        return "data", EXIT_DATA
    if isinstance(exc, (ModelError, SpecError)):
        return "config", EXIT_CONFIG
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom", EXIT_FAILED
    if isinstance(exc, NonFiniteLoss):
        return "nan", EXIT_FAILED
    return "internal", EXIT_FAILED


def _message(kind: str, exc: BaseException, step: int) -> str:
    if kind == "oom":
        return (f"out of GPU memory at step {step}: lower batch_size or max_seq_length, turn on "
                "gradient_checkpointing, or use load_in_4bit")
    if kind == "internal":
        return f"{type(exc).__name__}: {exc} (a bug: the traceback is in train.log)"
    return str(exc)


def _processes(spec: JobSpec) -> int:
    """How many processes run this job. Chooses its GPUs (CUDA_VISIBLE_DEVICES) unless that was
    done already: by the runner, or by whoever started torchrun."""
    from jobs import gpus
    from jobs.launch import launched_by_torchrun
    if launched_by_torchrun():
        if int(os.environ["WORLD_SIZE"]) > 1 and not spec.output_dir:
            raise SpecError("output_dir", "must be set when torchrun starts the job: every rank "
                            "writes to the same folder")
        return 1
    if os.environ.get(gpus.PLACED_ENV):
        return spec.processes or 1
    machine = gpus.read_gpus()
    gpus.check_request(spec.gpus, spec.processes, machine)
    placement, warning = gpus.place_now(spec.gpus, spec.processes, machine)
    if warning:
        print(f"warning: {warning}", flush=True)
    os.environ.update(placement.env())
    spec.gpus, spec.processes = placement.gpus_key, placement.processes
    return placement.processes


def _relaunch(argv: list[str], spec: JobSpec, processes: int):
    """Become torchrun with `processes` ranks of this same command (never returns)."""
    from jobs.launch import launch_argv
    pinned = ["--output_dir", spec.output_dir, "--gpus", spec.gpus, "--processes", str(processes)]
    command = launch_argv(sys.executable, processes) + ["-m", "jobs.train", *argv, *pinned]
    print(f"fusetune: {processes} processes through torchrun: {' '.join(command[1:])}", flush=True)
    os.execv(sys.executable, command)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        spec = load_spec(argv)
        processes = _processes(spec)
    except SpecError as exc:
        print(f"fusetune: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    spec.output_dir = spec.output_dir or _default_output_dir(spec)
    if processes > 1:
        _relaunch(argv, spec, processes)
    job_dir = Path(spec.output_dir)
    if os.environ.get("RANK", "0") == "0":  # under torchrun the ranks share the folder
        spec.write_yaml(JobLayout(job_dir).config)

    return _train(spec, job_dir)


class _QuietEvents:
    """The events of a rank other than 0: rank 0 reports the job; a rank's own failure is
    written by `_report_failure` straight to the job's EventWriter."""

    def emit(self, type: str, **fields):
        return {"type": type, **fields}


def _train(spec: JobSpec, job_dir: Path) -> int:
    # bitsandbytes warns on AVX512-BF16 CPUs that an optional hub kernel is missing; it has a
    # built-in CPU path, and the warning (naming a `kernels` package) only confuses users.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    from jobs import distributed
    from jobs.events import EventWriter
    from jobs.trainer import Trainer
    events = EventWriter(job_dir)
    try:
        dist = distributed.init()
    except Exception as exc:  # the rendezvous or the GPU: this rank never joined the others
        message = f"rank {os.environ.get('RANK', 0)} could not join the other ranks: {type(exc).__name__}: {exc}"
        events.emit("error", kind="internal", message=message, step=0, rank=int(os.environ.get("RANK", 0)))
        print(f"fusetune: {message}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    if dist.is_main:
        trainer = Trainer(spec, job_dir, events, log=lambda line: print(line, flush=True), dist=dist)
    else:
        trainer = Trainer(spec, job_dir, _QuietEvents(), log=lambda line: None, dist=dist)

    def request_stop(signum, _frame):
        if dist.is_main:
            print(f"received {signal.Signals(signum).name}: stopping after this step", flush=True)
        trainer.stop_requested = True
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    if dist.is_main:
        print(f"fusetune: job config {JobLayout(job_dir).config}", flush=True)
    try:
        trainer.run()
        dist.cleanup()
        return 0
    except Exception as exc:  # every failure is reported as an event, never lost
        return _report_failure(exc, trainer, events, dist)


def _report_failure(exc: Exception, trainer, events, dist) -> int:
    """Write the error event (rank 0 for what all ranks meet alike, otherwise the failing rank,
    naming itself) and return the exit code."""
    from jobs.distributed import lost_peer
    kind, code = _classify(exc)
    message = _message(kind, exc, trainer.step)
    if dist.enabled and lost_peer(exc):  # another rank failed first; jobs.launch names it
        code, detail = EXIT_PEER_LOST, (str(exc).splitlines() or [""])[0][:300]
        message = f"lost contact with the other ranks at step {trainer.step} ({type(exc).__name__}: {detail})"
    elif kind == "internal":
        traceback.print_exc(file=sys.stdout)
    rank = {}
    if dist.enabled:
        rank = {"rank": dist.rank}
        if kind == "killed":
            print(f"rank {dist.rank}: stopped at step {trainer.step}", flush=True)
            dist.cleanup()
        else:
            message = f"rank {dist.rank}: {message}"
    if dist.is_main or kind not in SHARED_ERROR_KINDS + ("killed",):
        events.emit("error", kind=kind, message=message, step=trainer.step, **rank)
    if dist.is_main or kind != "killed":
        print(message, flush=True)
        print(f"fusetune: {message}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
