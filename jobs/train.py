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
import warnings
from pathlib import Path

from jobs.layout import JobLayout
from jobs.spec import JobSpec, SpecError, short_name

EXIT_CONFIG, EXIT_DATA, EXIT_FAILED, EXIT_CANCELLED = 2, 3, 1, 130


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


def main(argv: list[str] | None = None) -> int:
    try:
        spec = load_spec(argv)
    except SpecError as exc:
        print(f"fusetune: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    spec.output_dir = spec.output_dir or _default_output_dir(spec)
    job_dir = Path(spec.output_dir)
    spec.write_yaml(JobLayout(job_dir).config)

    # bitsandbytes warns on AVX512-BF16 CPUs that an optional hub kernel is missing; it has a
    # built-in CPU path, and the warning (naming a `kernels` package) only confuses users.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # A library warning called from many places would print once per place; once is enough.
    warnings.simplefilter("once")
    from jobs.events import EventWriter
    from jobs.trainer import Trainer
    events = EventWriter(job_dir)
    trainer = Trainer(spec, job_dir, events, log=lambda line: print(line, flush=True))

    def request_stop(signum, _frame):
        print(f"received {signal.Signals(signum).name}: stopping after this step", flush=True)
        trainer.stop_requested = True
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    print(f"fusetune: job config {JobLayout(job_dir).config}", flush=True)
    try:
        trainer.run()
        return 0
    except Exception as exc:  # every failure is reported as an event, never lost
        kind, code = _classify(exc)
        message = _message(kind, exc, trainer.step)
        if kind == "internal":
            traceback.print_exc(file=sys.stdout)
        events.emit("error", kind=kind, message=message, step=trainer.step)
        print(message, flush=True)
        if not _same_file(sys.stdout, sys.stderr):  # the studio sends both to train.log: say it once
            print(f"fusetune: {message}", file=sys.stderr, flush=True)
        return code


def _same_file(first, second) -> bool:
    try:
        a, b = os.fstat(first.fileno()), os.fstat(second.fileno())
    except (OSError, ValueError, AttributeError):  # a stream without a file (captured in tests)
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


if __name__ == "__main__":
    sys.exit(main())
