"""Fusetune Studio: `python app.py [--host 127.0.0.1] [--port 7860] [--data-dir DIR]`, with the
password in FUSETUNE_AUTH=USER:PASS (or `--auth USER:PASS`, which every user of the machine can read
in `ps`)."""
from __future__ import annotations

import argparse
import logging
import os
import sqlite3
import sys
import threading
import time

# Before torch loads: see jobs/train/cli.py (two OpenMP runtimes must not busy-wait against each other).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# CUDA numbers GPUs as NVML does (PCI bus order), so the chat models' GPU is the queue's GPU.
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

from jobs.io import paths  # noqa: E402
from jobs.checks.access import ALLOW_REWARD_CODE_ENV, use_allowed_dirs  # noqa: E402
from jobs.queue.runner import Runner  # noqa: E402
from jobs.io.storage import PRIVATE_UMASK, StorageError  # noqa: E402

DEFAULT_MAX_UPLOAD_MB = 1024  # studio/upload_guard.py's default; the README states it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fusetune Studio: fine-tune LLMs with LoRA in your browser.")
    parser.add_argument("--host", default=os.environ.get("FUSETUNE_HOST", "127.0.0.1"),
                        help="address to bind (default 127.0.0.1: only this machine can connect)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("FUSETUNE_PORT", "7860")))
    parser.add_argument("--data-dir", default=None,
                        help="where jobs, uploads and the model cache live (default $FUSETUNE_HOME or ~/.fusetune)")
    parser.add_argument("--allow-dir", action="append", default=None, metavar="DIR",
                        help="a folder whose datasets and models the studio may read, besides its data dir "
                             "(repeatable; or FUSETUNE_ALLOW_DIRS=DIR1:DIR2)")
    parser.add_argument("--max-upload-mb", type=int, default=DEFAULT_MAX_UPLOAD_MB, metavar="MB",
                        help=f"largest dataset upload accepted, in MB (default {DEFAULT_MAX_UPLOAD_MB}); an upload "
                             "is also refused before it is written when the data dir's disk lacks the space")
    parser.add_argument("--allow-reward-code", action="store_true",
                        help="let the page upload a GRPO reward file (Python code that jobs run); without it a "
                             "reward file must already be in <data dir>/rewards or an --allow-dir folder outside "
                             "the data dir (docs/SECURITY.md)")
    parser.add_argument("--trusted-proxy", action="append", default=None, metavar="ADDRESS",
                        help="the address (or network, e.g. 10.0.0.0/8) of a reverse proxy in front of the studio, "
                             "whose X-Forwarded-For header names the real client (repeatable); by default no "
                             "forwarded header is believed, and each connection counts by its own address")
    parser.add_argument("--cluster", default=os.environ.get("FUSETUNE_CLUSTER", ""), metavar="ADDRESS",
                        help="a Ray cluster's dashboard address, e.g. http://head-node:8265 (or FUSETUNE_CLUSTER): "
                             "the Jobs tab shows its nodes, GPUs and jobs; a job trains there when its cluster key "
                             "names it (README \"Beyond one machine\")")
    parser.add_argument("--auth", default=None,
                        help="USER:PASS required to use the studio. Prefer the FUSETUNE_AUTH environment "
                             "variable: a command-line argument is visible to every user in `ps`")
    return parser.parse_args(argv)


def choose_auth(cli_value: str | None, env_value: str | None) -> str | None:
    """FUSETUNE_AUTH first; --auth works too, with a warning that `ps` shows it to everyone."""
    if cli_value:
        note = "; FUSETUNE_AUTH is set, so it is used and --auth is ignored" if env_value else ""
        print("[studio] warning: --auth puts the password in the process list, where every user of this "
              f"machine can read it (`ps`); set FUSETUNE_AUTH=USER:PASS in the environment instead{note}.",
              file=sys.stderr, flush=True)
    return env_value or cli_value


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise SystemExit("fusetune: the password setting must look like USER:PASS (both non-empty), "
                         "in FUSETUNE_AUTH or --auth")
    return user, password


def open_data_dir(chosen: str | None) -> tuple[object, Runner]:
    """The data dir and a Runner on it, or SystemExit with one line naming the path and the fix."""
    try:
        data_dir = paths.data_dir(chosen)
        tightened = paths.tighten(data_dir)
        if tightened:
            print(f"[studio] {tightened}", file=sys.stderr, flush=True)
        paths.check_writable(data_dir)
        runner = Runner(data_dir)
    except StorageError as exc:  # its text already names the path, the free space and the fix
        raise SystemExit(f"fusetune: cannot use the data dir: {exc}") from None
    except OSError as exc:
        raise SystemExit(f"fusetune: cannot use the data dir: {exc.filename or chosen}: {exc.strerror}. Pass "
                         "--data-dir with a folder you can write to, or set FUSETUNE_HOME") from None
    except sqlite3.Error as exc:
        raise SystemExit(f"fusetune: cannot open the job database {data_dir / 'jobs.sqlite'}: {exc}; fix its "
                         "permissions or free space, or pass another --data-dir") from None
    from jobs.export.leftovers import remove_leftovers   # what exports killed mid-write left (issue 36)
    removed = remove_leftovers(paths.jobs_dir(data_dir))
    if removed:
        print(f"[studio] removed {len(removed)} unfinished export file(s) left by stopped exports", flush=True)
    return data_dir, runner


def guards(auth, upload_dir: str | None = None, max_upload_mb: int = 0) -> list:
    """ASGI middleware for Gradio's app: uploads bounded by size and free space
    (studio/upload_guard.py), and with a password, failed logins slowed (studio/login_guard.py)."""
    from starlette.middleware import Middleware
    from studio.login_guard import LoginGuard
    from studio.upload_guard import UploadGuard
    found = [Middleware(UploadGuard, upload_dir=upload_dir, max_bytes=max_upload_mb * 1024 ** 2)] if upload_dir else []
    return found + ([Middleware(LoginGuard)] if auth else [])


def trust_proxies(proxies: list[str] | None) -> None:
    """--trusted-proxy: tell uvicorn (which reads FORWARDED_ALLOW_IPS when Gradio makes its Config)
    whose X-Forwarded-For to believe. Without the flag nobody's, not even loopback's (uvicorn's default
    trusts 127.0.0.1, so any local client could pick the address the login throttle counts, issue 36).
    SystemExit naming a value that is no address or network (uvicorn would silently ignore it)."""
    import ipaddress
    for proxy in proxies or []:
        try:
            ipaddress.ip_network(proxy.strip(), strict=False)
        except ValueError:
            raise SystemExit(f"fusetune: --trusted-proxy {proxy!r}: not an IP address or network; name the proxy "
                             "by its address, e.g. --trusted-proxy 127.0.0.1 or --trusted-proxy 10.0.0.0/8") from None
    os.environ["FORWARDED_ALLOW_IPS"] = ",".join(p.strip() for p in proxies or [])


def check_cluster(address: str) -> str:
    """--cluster: a dashboard address as a job's cluster key takes it, or SystemExit saying the form."""
    from jobs.spec_values import CLUSTER_ADDRESS
    address = (address or "").strip()
    if address and not CLUSTER_ADDRESS.match(address):
        raise SystemExit(f"fusetune: --cluster {address!r} is not a Ray dashboard address: give one like "
                         "http://head-node:8265 (the address `ray job submit` takes)")
    return address


def patient_launch_check(limit_s: float = 90.0) -> None:
    """Gradio's launch asks its own page once with a 3 s timeout and, when that one request times out,
    fails with "When localhost is not accessible, a shareable link must be created". On a loaded
    2-core machine (a job training, a browser open) rendering the page took longer than that and
    the studio did not start; this is the same check (a HEAD of the page, the same answers count)
    with patience. Set on gradio.networking, where Blocks.launch looks it up."""
    import httpx
    from gradio import networking

    def url_ok(url: str) -> bool:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                if httpx.head(url, timeout=15, verify=False).status_code in (200, 401, 301, 302, 303, 307, 308):
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return False
    networking.url_ok = url_ok


def refuse_busy_port(host: str, port: int) -> None:
    """SystemExit with one line when something already listens on host:port (another studio?),
    instead of Gradio's OSError traceback after every module has loaded."""
    import errno
    import socket
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return  # an unknown host: Gradio's own error says so
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is fine
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SystemExit(busy_port_line(host, port)) from None


def busy_port_line(host: str, port: int) -> str:
    return (f"fusetune: port {port} on {host} is already in use (another studio or program is serving "
            f"there): stop it, or pass --port with a free port (e.g. --port {port + 1})")


def warm_builtin_model(data_dir, start_check=None) -> None:
    """Convert the built-in GGUF once in the background, so the first job starts quickly; then run
    Start's check on the default job once, so the first press of Start finds the preflight's
    modules imported and the built-in tokenizer loaded (studio/start_check.py)."""
    from jobs.models.load import ModelError, resolve_model
    from jobs.spec import BUILTIN_MODEL, JobSpec
    from jobs.io.storage import as_storage_error, is_disk_error
    try:
        resolve_model(BUILTIN_MODEL, data_dir, log=lambda line: print(f"[studio] {line}", flush=True))
    except ModelError as exc:
        print(f"[studio] built-in model unavailable: {exc}", file=sys.stderr, flush=True)
        return
    except Exception as exc:  # a full disk: one line, not a thread traceback; the first job tries again
        if not is_disk_error(exc):
            raise
        print(f"[studio] built-in model not prepared: {as_storage_error(exc, paths.model_cache_dir(data_dir))}",
              file=sys.stderr, flush=True)
        return
    if start_check is not None:
        start_check.preflight(JobSpec())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    use_allowed_dirs(args.allow_dir)  # the studio's read policy (jobs/checks/access.py) picks them up
    trust_proxies(args.trusted_proxy)  # whose X-Forwarded-For the login throttle believes (studio/login_guard.py)
    cluster = check_cluster(args.cluster)  # the Ray cluster the Jobs tab shows (studio/cluster_view.py)
    if cluster:  # the one dashboard a cluster token goes to, here and in the jobs (jobs/io/cluster_auth.py)
        os.environ["FUSETUNE_CLUSTER"] = cluster
    if args.allow_reward_code:
        os.environ[ALLOW_REWARD_CODE_ENV] = "1"
    os.umask(PRIVATE_UMASK)  # uploads, jobs and caches are the user's alone (0600 files, 0700 folders)
    # Same as in jobs/train/cli.py: an optional bitsandbytes hub kernel, whose absence is harmless.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # Taken out of the environment, so that no child (trainer, export, preflight) inherits it.
    auth = parse_auth(choose_auth(args.auth, os.environ.pop("FUSETUNE_AUTH", None)))
    if auth is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"[studio] warning: serving on {args.host} without a password; anyone who can reach this "
              "port can start jobs. Set FUSETUNE_AUTH=USER:PASS.", file=sys.stderr, flush=True)
    refuse_busy_port(args.host, args.port)
    data_dir, runner = open_data_dir(args.data_dir)
    # Before gradio, torch or transformers load: their caches and temp files go in the data dir.
    paths.use_data_dir_caches(data_dir)
    # The studio imports transformers; do it before the warm-up thread does, not concurrently.
    from studio.app import PAGE_CSS, build_studio
    from studio.context import StudioContext
    from studio.route_guard import launch_kwargs as guard_kwargs
    from studio import quiet_page
    context = StudioContext(data_dir=data_dir, runner=runner, cluster=cluster)
    runner.studio_gpu = context.chat  # its models are the studio's, unloaded for a job that needs the room
    runner.start_monitor()
    demo = build_studio(data_dir, runner, context)
    print(f"[studio] data dir {data_dir}", flush=True)
    # Gradio hands out only files in its cache, the working directory, the temp dir (now inside the
    # data dir) or allowed_paths. Downloads (the adapter zips) live in the job folders, whose
    # contents the UI shows anyway; uploads, the model cache and everything else stay refused.
    patient_launch_check()
    try:
        # an idle page and studio cost next to nothing (studio/quiet_page.py: two of Gradio's busy loops)
        quiet_page.calm_queue(demo.queue(default_concurrency_limit=4)).launch(
            server_name=args.host, server_port=args.port, auth=auth, show_error=True, css=PAGE_CSS,
            allowed_paths=[str(paths.jobs_dir(data_dir))], prevent_thread_lock=True,
            # Gradio 6's run history keeps every event's inputs and outputs (chat texts, logs) in the
            # browser's localStorage, re-reading and re-writing all of it as JSON on each update: seconds
            # of a busy tab per click on this page, and a copy of the user's data the studio never shows
            run_history=False,
            **guard_kwargs([*guards(auth, os.environ["GRADIO_TEMP_DIR"], args.max_upload_mb),
                            quiet_page.middleware()]))
    except OSError as exc:  # taken between the check above and now
        if "port" not in str(exc).lower():
            raise
        runner.shutdown()
        raise SystemExit(busy_port_line(args.host, args.port)) from None
    # After launch: Gradio's one-shot 3 s check that the page answers fails the launch when the
    # GGUF conversion is busy in the same process on a loaded machine.
    threading.Thread(target=warm_builtin_model, args=(data_dir, context.start_check), daemon=True).start()
    demo.block_thread()


if __name__ == "__main__":
    main()
