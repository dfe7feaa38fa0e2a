"""Fusetune Studio: `python app.py [--host 127.0.0.1] [--port 7860] [--data-dir DIR] [--auth USER:PASS]`."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

# Before torch loads: see jobs/train.py (two OpenMP runtimes must not busy-wait against each other).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from jobs import paths  # noqa: E402
from jobs.runner import Runner  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fusetune Studio: fine-tune LLMs with LoRA in your browser.")
    parser.add_argument("--host", default=os.environ.get("FUSETUNE_HOST", "127.0.0.1"),
                        help="address to bind (default 127.0.0.1: only this machine can connect)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("FUSETUNE_PORT", "7860")))
    parser.add_argument("--data-dir", default=None,
                        help="where jobs, uploads and the model cache live (default $FUSETUNE_HOME or ~/.fusetune)")
    parser.add_argument("--auth", default=os.environ.get("FUSETUNE_AUTH"),
                        help="USER:PASS required to use the studio (or set FUSETUNE_AUTH)")
    return parser.parse_args(argv)


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise SystemExit("--auth must look like USER:PASS (both non-empty)")
    return user, password


def warm_builtin_model(data_dir) -> None:
    """Convert the built-in GGUF once in the background, so the first job starts quickly."""
    from jobs.models import ModelError, resolve_model
    from jobs.spec import BUILTIN_MODEL
    try:
        resolve_model(BUILTIN_MODEL, data_dir, log=lambda line: print(f"[studio] {line}", flush=True))
    except ModelError as exc:
        print(f"[studio] built-in model unavailable: {exc}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # Same as in jobs/train.py: an optional bitsandbytes hub kernel, whose absence is harmless.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    auth = parse_auth(args.auth)
    if auth is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"[studio] warning: serving on {args.host} without a password; anyone who can reach this "
              "port can start jobs. Set --auth USER:PASS or FUSETUNE_AUTH.", file=sys.stderr, flush=True)
    data_dir = paths.data_dir(args.data_dir)
    # The studio imports transformers; do it before the warm-up thread does, not concurrently.
    from studio.app import build_studio
    runner = Runner(data_dir)
    runner.start_monitor()
    demo = build_studio(data_dir, runner)
    print(f"[studio] data dir {data_dir}", flush=True)
    demo.queue(default_concurrency_limit=4).launch(
        server_name=args.host, server_port=args.port, auth=auth, show_error=True, prevent_thread_lock=True)
    # After launch: Gradio's one-shot 3 s check that the page answers fails the launch when the
    # GGUF conversion is busy in the same process on a loaded machine.
    threading.Thread(target=warm_builtin_model, args=(data_dir,), daemon=True).start()
    demo.block_thread()


if __name__ == "__main__":
    main()
