"""The studio's API server: `python -m jobs.serve` over the jobs picked on the Chat tab's Serve panel,
run as a child of the studio (no shell, in its own process group, as jobs/queue/runner.py starts a
trainer), its output in <data dir>/serve/serve.log. One server per studio: it is the machine's
port and memory, not one page's, so every page sees and switches the same one.

Stopping sends its group SIGTERM (uvicorn finishes the requests in flight), then SIGKILL after
GRACE_S. The studio stops it on the way out (atexit), and the server watches the studio's pid
(jobs/serve/cli.py PARENT_ENV), so a studio that is killed does not leave it serving."""
from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from jobs.io.storage import make_private_dir, open_private
from jobs.serve.cli import PARENT_ENV

ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 10.0
READY_LINE = re.compile(r"serving \d+ models at (\S+/v1) \((.*)\)")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
LOG_TAIL_LINES = 25


@dataclass
class ServeState:
    """What the page shows: running or not, the URL and model ids once it printed them, and why it ended."""

    running: bool = False
    url: str = ""
    models: list[str] = field(default_factory=list)
    host: str = ""
    failed: bool = False
    log_tail: str = ""


class ServeProcess:
    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.log_path = make_private_dir(self.data_dir / "serve") / "serve.log"
        self._proc: subprocess.Popen | None = None
        self._host = ""
        self._stopped = False   # stopped on purpose: its exit is no failure
        self._lock = threading.Lock()

    def start(self, job_dirs: list[str], host: str, port: int) -> None:
        """Stop the one running, then start a server for `job_dirs` on host:port."""
        self.stop()
        argv = [sys.executable, "-m", "jobs.serve", *map(str, job_dirs), "--host", host, "--port", str(int(port)),
                "--data-dir", str(self.data_dir)]
        env = {**os.environ, PARENT_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "PASSIVE",
               "TOKENIZERS_PARALLELISM": "false"}
        env.pop("FUSETUNE_API_KEY", None)   # the page's server takes the page's keys only
        with self._lock, open_private(self.log_path, "w", encoding="utf-8") as log:
            self._proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
            self._host, self._stopped = host, False

    def state(self) -> ServeState:
        with self._lock:
            proc, host, stopped = self._proc, self._host, self._stopped
        if proc is None:
            return ServeState()
        text = self._log_text()
        ready = READY_LINE.search(text)
        alive = proc.poll() is None
        state = ServeState(running=alive, host=host, failed=not alive and not stopped)
        if ready and alive:
            state.url, state.models = ready.group(1), [m.strip() for m in ready.group(2).split(",")]
        if state.failed:
            state.log_tail = "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
        return state

    def wait_ready(self, timeout_s: float, poll_s: float = 0.5) -> ServeState:
        """The state once the server printed its URL, ended, or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.state()
            if state.url or not state.running or time.monotonic() > deadline:
                return state
            time.sleep(poll_s)

    def stop(self) -> bool:
        """Stop the server and its group; False when none ran."""
        with self._lock:
            proc, self._stopped = self._proc, True
        if proc is None or proc.poll() is not None:
            return False
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        return True

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)   # its own group: start_new_session made the server its leader
    except ProcessLookupError:
        pass


_SERVERS: dict[Path, ServeProcess] = {}
_SERVERS_LOCK = threading.Lock()


def serve_process(data_dir: Path) -> ServeProcess:
    """The studio's server of this data dir (made on first use, stopped when the studio exits)."""
    key = Path(data_dir).resolve()
    with _SERVERS_LOCK:
        if key not in _SERVERS:
            _SERVERS[key] = ServeProcess(key)
            atexit.register(_SERVERS[key].stop)
        return _SERVERS[key]
