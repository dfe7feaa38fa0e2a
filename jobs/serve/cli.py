"""Serve finished jobs over an OpenAI-compatible HTTP API.

`python -m jobs.serve JOB_DIR [JOB_DIR ...] [--host H] [--port P] [--api-key KEY] [--keys-file FILE]`:
the jobs' common base model (by its own name) and each job's adapter (by its folder's name) as models
of one server. Keys: `--api-key` and every key of the studio's key store (jobs/serve/keys.py, created
on the Chat tab's Serve panel), re-read when it changes; with neither, no key is asked for.
Prints one line, `Fusetune API serving N models at http://HOST:PORT/v1`, once it accepts requests.
Exit 2 with a one-line reason when a job cannot be served, 1 when the address cannot be bound."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # as jobs/train/cli.py: before torch loads

import argparse  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

from jobs.serve.scheduler import IDLE_KEEP_S, MAX_BATCH_ROWS, MAX_WAITING  # noqa: E402

KEY_ENV = "FUSETUNE_API_KEY"
# The studio's Serve switch sets this to its own pid: the server stops when the studio is gone, also
# when the studio was killed and had no chance to stop it (studio/serve_runs.py).
PARENT_ENV = "FUSETUNE_SERVE_PARENT"
LOCAL = ("127.0.0.1", "localhost", "::1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jobs.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("job_dirs", nargs="+", metavar="JOB_DIR", help="finished jobs (config.yaml + adapter/)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--api-key", default=None, help=f"require 'Authorization: Bearer KEY' (or set {KEY_ENV})")
    parser.add_argument("--data-dir", default=None, help="Fusetune data dir holding the model cache")
    parser.add_argument("--keys-file", default=None,
                        help="the API key store whose keys are accepted too (default: the data dir's "
                             "api-keys.json, the keys made on the Chat tab's Serve panel)")
    parser.add_argument("--max-waiting", type=int, default=MAX_WAITING,
                        help=f"requests that may wait for a batch; more are answered 429 (default {MAX_WAITING})")
    parser.add_argument("--max-batch", type=int, default=MAX_BATCH_ROWS,
                        help=f"answers generated together in one batch (default {MAX_BATCH_ROWS})")
    parser.add_argument("--keep-batches-s", type=float, default=IDLE_KEEP_S,
                        help="seconds a finished GPU batch (its CUDA graph and KV cache) waits for the next request "
                             f"of its model, so that request skips the capture; 0 frees it at once (default "
                             f"{IDLE_KEEP_S:g})")
    return parser


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    key = args.api_key or os.environ.get(KEY_ENV) or None
    if min(args.max_waiting, args.max_batch) < 1:
        print("error: --max-waiting and --max-batch must be at least 1", file=sys.stderr)
        return 2
    if not 0 <= args.keep_batches_s <= 86400:
        print("error: --keep-batches-s must be between 0 and 86400 seconds", file=sys.stderr)
        return 2
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port} ({exc.strerror or exc}): pick another --port",
              file=sys.stderr)
        return 1
    from jobs.serve.served import ServeError, load_served
    try:
        served = load_served(args.job_dirs, args.data_dir, log=lambda line: print(line, file=sys.stderr))
    except ServeError as exc:
        sock.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from jobs.serve.keys import KeyFileError, KeyStore, keys_file
    store = KeyStore(args.keys_file or keys_file(args.data_dir))
    try:
        stored = store.list()
    except KeyFileError as exc:
        sock.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if key is None and not stored and args.host not in LOCAL:
        print(f"warning: serving on {args.host} without an API key: anyone who can reach it may use it "
              f"(set --api-key or {KEY_ENV}, or create a key on the Chat tab's Serve panel)", file=sys.stderr)
    _run(served, sock, key, store, args)
    return 0


def _run(served, sock: socket.socket, key: str | None, store, args) -> None:
    import uvicorn

    from jobs.serve.api import create_app
    from jobs.serve.engine import Engine
    from jobs.serve.scheduler import Scheduler

    engine = Engine(served.model, log=lambda line: print(line, file=sys.stderr), slots=args.max_batch)
    scheduler = Scheduler(engine, max_waiting=args.max_waiting, max_batch_rows=args.max_batch,
                          keep_idle_s=args.keep_batches_s)
    app = create_app(served, scheduler, key, store)
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if not self.should_exit:
                print(f"Fusetune API serving {len(served.models)} models at {url} "
                      f"({', '.join(served.models)})", flush=True)

    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    server = AnnouncingServer(config)
    _stop_with_parent(server)
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.stop()


def _stop_with_parent(server) -> None:
    """With PARENT_ENV set (by the studio), end the server once that process is gone."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit():
        return
    import threading
    import time

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(1.0)
        print("the studio that started this server is gone: stopping", file=sys.stderr, flush=True)
        server.should_exit = True

    threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()
