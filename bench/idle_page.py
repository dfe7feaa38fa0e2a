"""What an open, idle Jobs page costs: CPU of the browser and of the studio while nothing runs.

    python bench/idle_page.py [--seconds 60] [--settle 150] [--out bench/results/idle_page.jsonl]

Starts `app.py` on a fresh data dir (loopback, a free port), opens it in Debian's chromium (headless,
through Playwright, as the browser tests do), picks the Jobs tab and leaves the page alone. After
`--settle` seconds (the page's load, the studio's warm-up on a fresh data dir: the built-in model's
conversion and the fit check's measured step, and the poll's back-off reaching its idle interval, 30 s,
about 80 s after the tab was picked) it sums the CPU time of its own chromium's processes (with Playwright's driver) and of the studio's process tree over
`--seconds`, and records each as a percent of one core (issue 40's targets: <= 5 % browser,
<= 2 % studio). Bounded: it stops by itself and kills what it started."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_studio(port: int, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"the studio did not listen on port {port} within {limit_s:.0f} s")


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def browser_processes(studio_pid: int) -> list[psutil.Process]:
    """This script's own chromium: Playwright's driver is our child and chromium the driver's (any
    other chromium on the machine, e.g. a browser test running beside, is not counted)."""
    studio = {p.pid for p in tree(studio_pid)}
    return [p for p in tree(os.getpid())[1:] if p.pid not in studio]


@contextlib.contextmanager
def studio_in_browser():
    """`app.py` on a fresh data dir (loopback, a free port) and a page of it in headless chromium;
    yields (page, the studio's pid) and kills the studio's process group afterwards."""
    from tests.e2e.browser import chromium_browser, new_context
    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        studio = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--data-dir", home],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            wait_for_studio(port)
            with chromium_browser() as browser:
                page = new_context(browser).new_page()
                page.goto(f"http://127.0.0.1:{port}/")
                yield page, studio.pid
        finally:
            os.killpg(studio.pid, 9)


def measure(seconds: float, settle: float) -> dict:
    with studio_in_browser() as (page, studio_pid):
        page.get_by_role("tab", name="Jobs").click()
        time.sleep(settle)
        browsers, studios = browser_processes(studio_pid), tree(studio_pid)
        b0, s0, t0 = cpu_seconds(browsers), cpu_seconds(studios), time.monotonic()
        time.sleep(seconds)
        b1, s1, elapsed = cpu_seconds(browsers), cpu_seconds(studios), time.monotonic() - t0
    return {"browser_cpu_pct": round(100 * (b1 - b0) / elapsed, 2),
            "studio_cpu_pct": round(100 * (s1 - s0) / elapsed, 2), "seconds": round(elapsed, 1),
            "settle_s": settle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--settle", type=float, default=150)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "idle_page.jsonl"))
    args = parser.parse_args()
    record("idle_page", measure(args.seconds, args.settle), args.out)


def record(bench: str, measured: dict, out: str) -> None:
    """One JSON line (the bench, when, this machine, what it measured), printed and added to `out`."""
    row = {"bench": bench, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": platform.processor()
           or platform.machine(), "cores": os.cpu_count(), **measured}
    line = json.dumps(row)
    print(line)
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


if __name__ == "__main__":
    main()
