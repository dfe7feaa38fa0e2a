"""Export a finished job: the PEFT adapter zip, a merged Hugging Face folder, or a GGUF file.

`python -m jobs.export JOB_DIR --format adapter|merged|gguf [--quant f16|bf16|q8_0] [--out PATH]`.
Progress lines look like `[ 42%] message` (the studio's Export tab reads them, see protocol.py);
the last lines name each file written and its size. Exit 0 on success, 1 with a one-line
reason on stderr otherwise."""
from __future__ import annotations

import os

# As in jobs/train/cli.py: bitsandbytes (QLoRA merges) and torch each bring an OpenMP runtime whose
# busy-waiting threads slow each other down; must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from jobs.export import FORMATS, QUANTS, ExportError, export  # noqa: E402
from jobs.messages import say  # noqa: E402
from jobs.export.protocol import ERROR_PREFIX, NOTE_PREFIX, RESULT_PREFIX, progress_line  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jobs.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("job_dir", help="the job's output folder (has config.yaml and adapter/)")
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="adapter: PEFT zip (+ llama.cpp LoRA GGUF); merged: HF safetensors folder; "
                             "gguf: one GGUF file with an Ollama Modelfile beside it")
    parser.add_argument("--quant", default="f16", choices=QUANTS, help="GGUF tensor type (default f16)")
    parser.add_argument("--out", default=None,
                        help="output path (default: inside JOB_DIR/exports/, the zip in JOB_DIR)")
    parser.add_argument("--data-dir", default=None, help="Fusetune data dir holding the model cache")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where to merge: auto (a GPU if any; merged weights then bf16), cpu or cuda")
    return parser


def print_progress(fraction: float, message: str) -> None:
    print(progress_line(fraction, message), flush=True)


class Cancelled(BaseException):
    """SIGTERM (the Export tab's Cancel): unwinds the export, whose temporary files are removed on
    the way out (jobs/export/files.py), like a KeyboardInterrupt."""


def _cancel(_signum, _frame) -> None:
    raise Cancelled()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _cancel)
    try:
        result = export(args.job_dir, args.format, args.quant, args.out, args.data_dir,
                        progress=print_progress, log=lambda line: print(line, flush=True), device=args.device)
    except ExportError as exc:
        print(f"{ERROR_PREFIX}{exc}", file=sys.stderr, flush=True)
        return 1
    except (Cancelled, KeyboardInterrupt):
        print(f"{ERROR_PREFIX}{say('export_cancelled')}", file=sys.stderr, flush=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    for note in result.notes:
        print(f"{NOTE_PREFIX}{note}", flush=True)
    for line in result.summary().splitlines():
        print(f"{RESULT_PREFIX}{line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
