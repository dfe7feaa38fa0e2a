"""The Export tab's running exports, so that Cancel can stop one within seconds (issue 36 item 5).

Each export is `python -m jobs.export` in its own process group (start_new_session), kept here
under the key of the page that started it (Gradio's session hash). Cancel sends the group SIGTERM:
the CLI unwinds, its temporary files are removed on the way out (jobs/export/files.py) and it exits;
one still alive after GRACE_S (inside a long C call) gets SIGKILL, and then whatever that process
left under its pid is removed (jobs/export/leftovers.py). The group signal reaches any child the
export may have started too."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

GRACE_S = 5.0


@dataclass
class Running:
    proc: subprocess.Popen
    job_dir: Path
    cancelled: bool = False


class ExportRuns:
    """The exports running now, by page key; one per key (a page runs one export at a time)."""

    def __init__(self):
        self._running: dict[str, Running] = {}
        self._lock = threading.Lock()

    def start(self, key: str, command: list[str], job_dir, **popen) -> Running:
        proc = subprocess.Popen(command, start_new_session=True, **popen)
        run = Running(proc, Path(job_dir))
        with self._lock:
            self._running[key] = run
        return run

    def done(self, key: str, run: Running) -> None:
        with self._lock:
            if self._running.get(key) is run:
                del self._running[key]

    def cancel(self, key: str) -> bool:
        """Stop the export `key` started; False when none runs. Returns once it has ended."""
        with self._lock:
            run = self._running.get(key)
        if run is None or run.proc.poll() is not None:
            return False
        run.cancelled = True
        _signal_group(run.proc, signal.SIGTERM)
        try:
            run.proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(run.proc, signal.SIGKILL)
            run.proc.wait()
        from jobs.export.leftovers import remove_job_leftovers
        remove_job_leftovers(run.job_dir, pid=run.proc.pid)
        return True


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)   # its own group: start_new_session made the export its leader
    except ProcessLookupError:
        pass
