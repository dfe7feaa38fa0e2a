"""`python -m jobs.train CONFIG.yaml [--key value ...] [--data-dir DIR]`: run one training job headless.

Exactly what the studio's Start button runs. Exit 0 on success; otherwise non-zero with a one-line
reason on stderr, an `error` event (with a `kind`) in events.jsonl, and the log and last
checkpoint left in the output dir. Any JobSpec field can be overridden on the command line.
`--data-dir` (default $FUSETUNE_HOME or ~/.fusetune) holds the model cache and the libraries'
caches; the studio passes its own. The job's stdout and stderr also go to <output_dir>/train.log."""
from __future__ import annotations

import os

# torch and bitsandbytes' CPU library each bring an OpenMP runtime; with the default busy-wait
# policy their two thread pools spin against each other and CPU training slows down up to 100x.
# Must be set before torch loads. (Found measuring a 135M run on 2 cores: 160 -> 3 tokens/s.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import contextlib
import dataclasses
import io
import logging
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

from jobs.io import paths
from jobs.launch import EXIT_PEER_LOST
from jobs.io.layout import JobLayout
from jobs.io.logtee import tee_to_log
from jobs.messages import say
from jobs.spec import JobSpec, SpecError, short_name
from jobs.io.storage import (PRIVATE_UMASK, StorageError, as_storage_error, is_disk_error, make_private_dir,
                          write_private_text)

EXIT_CONFIG, EXIT_DATA, EXIT_FAILED, EXIT_IO, EXIT_CANCELLED = 2, 3, 1, 5, 130  # 4: a lost distributed peer
# Errors every rank meets alike (the same data, config, loss): reported once, by rank 0.
SHARED_ERROR_KINDS = ("data", "config", "nan")


def build_parser() -> argparse.ArgumentParser:
    """The CLI, generated from JobSpec so it cannot drift from the UI form or the YAML."""
    parser = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", help="a YAML file with JobSpec keys (see README)")
    parser.add_argument("--data-dir", dest="data_dir", default=None, metavar="DIR",
                        help="Fusetune's data dir: model cache and library caches (default $FUSETUNE_HOME "
                             "or ~/.fusetune); not a job key")
    parser.add_argument("--dry-run", dest="dry_run", action="store_true", default=None,
                        help="check the job as the studio's Start does (model, tokenizer, target modules, "
                             "the whole dataset, limits), print a summary and exit without training")
    for f in dataclasses.fields(JobSpec):
        parser.add_argument(f"--{f.name}", dest=f.name, default=None, metavar=f.type.upper(),
                            help=f.metadata.get("help", ""))
    return parser


def parse(argv: list[str] | None) -> tuple[JobSpec, str | None]:
    """The job's spec (config file plus command-line overrides) and the --data-dir given, if any."""
    args = vars(build_parser().parse_args(argv))
    config, data_dir = args.pop("config"), args.pop("data_dir")
    data = read_config(Path(config)) if config else {}
    data.update({k: v for k, v in args.items() if v is not None})
    return JobSpec.from_dict(data), data_dir


def load_spec(argv: list[str] | None) -> JobSpec:
    return parse(argv)[0]


def read_config(path: Path) -> dict:
    """The YAML mapping in `path`; every way it can be unreadable is a SpecError saying the fix."""
    import yaml
    from jobs.yaml_bounded import load_config_yaml
    if not path.is_file():
        raise SpecError(None, say("config_missing", path=path))
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(None, say("config_not_utf8", path=path, offset=exc.start, byte=exc.object[exc.start])) from None
    except OSError as exc:
        raise SpecError(None, say("config_unreadable", path=path, detail=exc.strerror)) from None
    try:
        data = load_config_yaml(text, str(path)) or {}
    except yaml.YAMLError as exc:
        raise SpecError(None, say("config_not_yaml", path=path, detail=" ".join(str(exc).split()))) from None
    if not isinstance(data, dict):
        raise SpecError(None, say("config_not_mapping", path=path))
    return data


def _default_output_dir(spec: JobSpec) -> str:
    return str(Path("outputs") / f"{short_name(spec.model)}-{time.strftime('%Y%m%d-%H%M%S')}")


def whole_lines() -> None:
    """Each line this process prints reaches its log in one write. The runner sets PYTHONUNBUFFERED,
    under which `print` writes a line's text and its newline apart, and torchrun's ranks append to one
    train.log: another rank's line could land in between (CI saw "rank 1: stopped at step 19rank 0: ...").
    Line buffering keeps the log live; the whole line then goes out at its newline."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(write_through=False, line_buffering=True)


def _classify(exc: BaseException) -> tuple[str, int]:
    """The error event's kind and the exit code for a failure."""
    import torch
    from jobs.data.dataset import DataError
    from jobs.models.load import ModelError
    from jobs.train.loop import Cancelled, NonFiniteLoss
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
    if is_disk_error(exc):
        return "io", EXIT_IO
    return "internal", EXIT_FAILED


def _message(kind: str, exc: BaseException, step: int, job_dir: Path) -> str:
    if kind == "oom" and getattr(exc, "for_people", False):
        return str(exc)   # the trainer's message: estimate, peak seen, what to change
    if kind == "oom":
        return say("out_of_gpu_memory", step=step)
    if kind == "io":
        return str(as_storage_error(exc, job_dir, action="write" if isinstance(exc, StorageError) else "use"))
    if kind == "internal":
        return f"{type(exc).__name__}: {exc} (a bug: the traceback is in train.log)"
    return str(exc)


def _processes(spec: JobSpec) -> int:
    """How many processes run this job. Chooses its GPUs (CUDA_VISIBLE_DEVICES) unless that was
    done already: by the runner, or by whoever started torchrun."""
    from jobs.io import gpus
    from jobs.launch import launched_by_torchrun
    if launched_by_torchrun():
        if int(os.environ["WORLD_SIZE"]) > 1 and not spec.output_dir:
            raise SpecError("output_dir", say("torchrun_needs_output_dir"))
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
    from jobs.launch import spec_launch_argv
    pinned = ["--output_dir", spec.output_dir, "--gpus", spec.gpus, "--processes", str(processes)]
    command = spec_launch_argv(sys.executable, processes, spec.to_dict()) + ["-m", "jobs.train", *argv, *pinned]
    where = f" on node {spec.node_rank} of {spec.nodes}" if spec.nodes > 1 else ""
    count = f"{processes} process" + ("es" if processes != 1 else "")
    print(f"fusetune: {count}{where} through torchrun: {' '.join(command[1:])}", flush=True)
    os.execv(sys.executable, command)


def dry_run(argv: list[str]) -> int:
    """--dry-run: the preflight the studio's Start runs (jobs/checks/preflight.py); 0 when the job would
    start, otherwise the exit code of its first problem, with the problems on stderr."""
    try:
        spec, data_dir = parse(argv)
    except SpecError as exc:
        print(f"fusetune: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        root = paths.data_dir(data_dir)
        paths.use_data_dir_caches(root)
    except OSError as exc:
        print(f"fusetune: {as_storage_error(exc, data_dir or root)}", file=sys.stderr)
        return EXIT_IO
    from jobs.checks.preflight import run_preflight
    report = run_preflight(spec, data_dir=root, log=lambda line: print(line, flush=True))
    print(report.summary(), flush=True)
    if report.ok:
        return 0
    print(f"fusetune: {report.error()}", file=sys.stderr)
    return EXIT_DATA if report.problems[0].key in ("dataset", "eval_dataset") else EXIT_CONFIG


def _prepare(spec: JobSpec, data_dir: str | None) -> Path:
    """Create the data dir and output dir (private) and point library caches into the data dir.
    Raises StorageError (one line: path, free space, fix) when either cannot be written."""
    try:
        root = paths.data_dir(data_dir)
        paths.check_writable(root)
        paths.use_data_dir_caches(root)
        job_dir = make_private_dir(spec.output_dir)
        paths.check_writable(job_dir)
    except OSError as exc:
        raise as_storage_error(exc, spec.output_dir) from None
    return root


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--dry-run" in argv:
        return dry_run([arg for arg in argv if arg != "--dry-run"])
    os.umask(PRIVATE_UMASK)  # everything the job writes is the user's alone
    try:
        spec, data_dir = parse(argv)
        processes = 1 if spec.cluster else _processes(spec)  # Ray places a cluster job, not this machine
    except SpecError as exc:
        print(f"fusetune: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    spec.output_dir = spec.output_dir or _default_output_dir(spec)
    from jobs.launch import launched_by_torchrun
    if processes > 1 or (spec.nodes > 1 and not launched_by_torchrun()):  # several machines: torchrun meets the rest
        _relaunch(argv, spec, processes)
    try:
        root = _prepare(spec, data_dir)
    except StorageError as exc:
        print(f"fusetune: {exc}", file=sys.stderr)
        return EXIT_IO
    layout = JobLayout(spec.output_dir)
    with tee_to_log(layout.log):
        if spec.cluster:  # submitted to the Ray cluster, its logs followed here (jobs/train/cluster.py)
            from jobs.train.cluster import submit_and_follow
            return submit_and_follow(spec, layout, root)
        return _run(spec, layout, root)


class _QuietEvents:
    """The events of a rank other than 0: rank 0 reports the job; a rank's own failure is
    written by `_report_failure` straight to the job's EventWriter."""

    def emit(self, type: str, **fields):
        return {"type": type, **fields}


class _NotStarted:
    """What `_report_failure` reads of a trainer that could not be made."""
    step = 0


def _make_trainer(spec: JobSpec, layout: JobLayout, events, data_dir: Path, dist):
    from jobs.train.loop import Trainer
    if dist.is_main:
        _attach_trackers(spec, events, layout.root)
        return Trainer(spec, layout.root, events, data_dir=data_dir, log=lambda line: print(line, flush=True),
                       dist=dist)
    return Trainer(spec, layout.root, _QuietEvents(), data_dir=data_dir, log=lambda line: None, dist=dist)


def _run(spec: JobSpec, layout: JobLayout, data_dir: Path, on_trainer=None) -> int:
    """Train in this process (one rank); `on_trainer(trainer)`: a Ray worker's cancel watch (ray_worker.py)."""
    try:
        if os.environ.get("RANK", "0") == "0":  # under torchrun the ranks share the folder
            write_private_text(layout.config, spec.to_yaml())
    except OSError as exc:
        print(f"fusetune: {as_storage_error(exc, layout.config)}", file=sys.stderr)
        return EXIT_IO
    # bitsandbytes warns on AVX512-BF16 CPUs that an optional hub kernel is missing; it has a
    # built-in CPU path, and the warning (naming a `kernels` package) only confuses users.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # A library warning called from many places would print once per place; once is enough.
    warnings.simplefilter("once")
    # Warnings about library internals that no setting of the user's can act on: PEFT 0.21 reads
    # transformers 5's deprecated `is_gradient_checkpointing` alias (peft_model.py), and torch 2.13's own
    # torch.utils.mkldnn (imported by torch.fx) uses its deprecated `torch.jit.script_method`
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    warnings.filterwarnings("ignore", message="`torch.jit.script_method` is deprecated", category=DeprecationWarning)
    from jobs.train import distributed
    from jobs.io.events import EventWriter
    events = EventWriter(layout.root)
    try:
        dist = distributed.init()
    except Exception as exc:  # the rendezvous or the GPU: this rank never joined the others
        message = say("rank_not_joined", rank=os.environ.get("RANK", 0), detail=f"{type(exc).__name__}: {exc}")
        events.emit("error", kind="internal", message=message, step=0, rank=int(os.environ.get("RANK", 0)))
        print(f"fusetune: {message}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    try:
        trainer = _make_trainer(spec, layout, events, data_dir, dist)
    except SpecError as exc:  # e.g. a reward file the rule for code refuses (jobs/checks/reward_code.py)
        return _report_failure(exc, _NotStarted(), events, layout.root, dist)

    def request_stop(signum, _frame):
        if dist.is_main:
            print(f"received {signal.Signals(signum).name}: stopping after this step", flush=True)
        trainer.stop_requested = True
    # a Ray Train worker trains in a thread of its actor, where signals cannot be handled (nor are sent)
    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT) if in_main}
    if on_trainer is not None:
        on_trainer(trainer)

    if dist.is_main:
        print(f"fusetune: job config {layout.config}", flush=True)
    try:
        trainer.run()
        trainer.ddp = None  # DDP's reducer holds the process group: dropped so that finish() really ends it
        dist.finish()
        return 0
    except Exception as exc:  # every failure is reported as an event, never lost
        return _report_failure(exc, trainer, events, layout.root, dist)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _attach_trackers(spec: JobSpec, events, job_dir: Path) -> None:
    """report_to: the trackers listen to rank 0's events (jobs/io/tracking.py)."""
    from jobs.spec import trackers
    if trackers(spec):
        from jobs.io.tracking import Trackers
        events.sinks.append(Trackers(job_dir, spec.to_dict(), trackers(spec), log=lambda line: print(line, flush=True)))


def _report_failure(exc: Exception, trainer, events, job_dir: Path, dist) -> int:
    """The error event (rank 0 for what all ranks meet alike, otherwise the failing rank, naming
    itself), and one line on stderr (which train.log also gets), for a failed run."""
    from jobs.train.distributed import lost_peer
    kind, code = _classify(exc)
    message = _message(kind, exc, trainer.step, job_dir)
    if dist.enabled and lost_peer(exc):  # another rank failed first; jobs.launch names it
        code, detail = EXIT_PEER_LOST, (str(exc).splitlines() or [""])[0][:300]
        message = say("ranks_lost", step=trainer.step, detail=f"{type(exc).__name__}: {detail}")
    elif kind == "internal":
        traceback.print_exc(file=sys.stdout)
    rank = {}
    if dist.enabled:
        rank = {"rank": dist.rank}
        if kind == "killed":
            print(f"rank {dist.rank}: stopped at step {trainer.step}", flush=True)
            dist.cleanup()
        else:
            message = say("on_rank", rank=dist.rank, message=message)
    if dist.is_main or kind not in SHARED_ERROR_KINDS + ("killed",):
        try:
            events.emit("error", kind=kind, message=message, step=trainer.step, **rank)
        except OSError as write_error:  # the disk that failed the job may refuse the event too
            message = say("error_event_lost", message=message, problem=as_storage_error(write_error, events.path))
    if not dist.is_main and kind == "killed":
        return code
    with contextlib.suppress(OSError):  # stderr may be a log file on that full disk
        print(f"fusetune: {message}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    whole_lines()
    sys.exit(main())
