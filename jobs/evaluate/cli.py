"""`python -m jobs.evaluate CONFIG.yaml [--data-dir DIR] [--in-folder]`: evaluate a finished job
(jobs/evaluate/config.py says the keys; the studio runs it through its job queue, jobs/queue/evaluations.py,
with --in-folder). Writes `<job>/evaluations/<name>/` (jobs/io/layout.py EvalLayout), prints the table
and the folder. Exit 0 done; 2 a refused config (one line naming the field), 3 bad eval data, 5 a data dir
that cannot be written, 1 other failures, 130 cancelled (SIGTERM: the rows scored so far are kept, with their table)."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # as jobs/train/cli.py: before torch loads

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from jobs.data.conversation import DataError  # noqa: E402
from jobs.evaluate.config import EvalConfig  # noqa: E402
from jobs.export.files import ExportError  # noqa: E402
from jobs.export.job_config import exported_spec  # noqa: E402
from jobs.io import paths  # noqa: E402
from jobs.io.events import EventWriter  # noqa: E402
from jobs.io.layout import EvalLayout, new_eval_folder  # noqa: E402
from jobs.io.storage import as_storage_error  # noqa: E402
from jobs.spec import SpecError  # noqa: E402

EXIT_CONFIG, EXIT_DATA, EXIT_IO, EXIT_CANCELLED = 2, 3, 5, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jobs.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="the evaluation's YAML (job, eval_file, max_new_tokens, metrics, tasks...)")
    parser.add_argument("--data-dir", default=None, help="Fusetune data dir holding the model cache")
    parser.add_argument("--in-folder", action="store_true",
                        help="CONFIG is <job>/evaluations/<name>/config.yaml, made by the studio's queue "
                             "(jobs/queue/evaluations.py): evaluate in that folder instead of a new one")
    return parser


def _err(line: str) -> None:
    print(f"error: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.umask(0o077)   # the job folder's files are private (docs/contracts.md, "Data dir")
    queued = EvalLayout(Path(args.config).parent) if args.in_folder else None
    try:
        config = EvalConfig.from_yaml(args.config, to_run=queued is None)
        spec = exported_spec(config.job)
        layout = queued or new_eval_folder(config.job, config.name)
    except (SpecError, ExportError) as exc:
        if queued is not None:   # the queue reads why from the folder's events, as a job's
            EventWriter(queued.root).emit("error", kind="config", message=str(exc))
        _err(str(exc))
        return EXIT_CONFIG
    if queued is None:
        config.name = layout.root.name
        layout.config.write_text(config.to_yaml(), encoding="utf-8")
    _use_gpus(config.gpus)
    try:   # the libraries' caches (lm-eval's datasets) in the data dir, as the trainer's (jobs/io/paths.py)
        data_dir = paths.data_dir(args.data_dir)
        paths.use_data_dir_caches(data_dir)
    except OSError as exc:
        _err(str(as_storage_error(exc, args.data_dir or "the data dir")))
        return EXIT_IO
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    return _run(config, spec, layout, data_dir, lambda: stop["asked"])


def _is_stderr(path: Path) -> bool:
    try:
        ours, theirs = os.fstat(sys.stderr.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)


def _use_gpus(key: str) -> None:
    """Run on the GPU the config names, unless whoever started it chose already (the queue sets
    FUSETUNE_GPUS_PLACED with CUDA_VISIBLE_DEVICES, as for the trainer: jobs/io/gpus.py)."""
    if key != "auto" and not os.environ.get("FUSETUNE_GPUS_PLACED"):
        os.environ.update(CUDA_VISIBLE_DEVICES=key, CUDA_DEVICE_ORDER="PCI_BUS_ID")


def _run(config, spec, layout: EvalLayout, data_dir, cancelled) -> int:
    from jobs.evaluate.run import Evaluation
    log_file = open(layout.log, "a", encoding="utf-8")   # noqa: SIM115 - open for the whole run
    to_file = not _is_stderr(layout.log)   # the queue points stderr at evaluate.log: once is enough

    def log(line: str) -> None:   # stderr for a terminal, evaluate.log for the page and later
        print(line, file=sys.stderr, flush=True)
        if to_file:
            log_file.write(f"{line}\n")
            log_file.flush()

    evaluation = Evaluation(config, spec, layout, data_dir, log=log)
    try:
        return _outcome(evaluation, layout, cancelled, log)
    finally:
        log_file.close()


def _outcome(evaluation, layout: EvalLayout, cancelled, log) -> int:
    from jobs.serve.served import ServeError
    try:
        summary = evaluation.run(cancelled)
    except (SpecError, ServeError) as exc:
        evaluation.events.emit("error", kind="config", message=str(exc))
        _err(str(exc))
        return EXIT_CONFIG
    except DataError as exc:
        evaluation.events.emit("error", kind="data", message=str(exc))
        _err(str(exc))
        return EXIT_DATA
    except Exception as exc:   # noqa: BLE001 - one line for the person, the traceback for the log
        log(traceback.format_exc().rstrip())
        evaluation.events.emit("error", kind="internal", message=f"{type(exc).__name__}: {exc}")
        _err(f"{type(exc).__name__}: {exc}")
        return 1
    from jobs.evaluate.table import format_table
    print(format_table(summary["table"]))
    print(f"results: {layout.root}")
    return EXIT_CANCELLED if summary["cancelled"] else 0
