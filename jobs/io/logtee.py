"""train.log for a job run from the command line: stdout and stderr also go to the log file.

A job the runner starts has its stdout and stderr redirected to train.log already; teeing there
would write every line twice, so `tee_to_log` does nothing when stdout already is that file."""
from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Iterator

from jobs.io.storage import open_private


class _Tee(io.TextIOBase):
    """A text stream writing to the console stream and to the log. A failing log write (a full
    disk) never stops the console output."""

    def __init__(self, stream, log):
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        self._stream.write(text)
        with contextlib.suppress(OSError, ValueError):
            self._log.write(text)
            if "\n" in text:
                self._log.flush()
        return len(text)

    def flush(self) -> None:
        self._stream.flush()
        with contextlib.suppress(OSError, ValueError):
            self._log.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", "utf-8")


def already_logging_to(path: Path) -> bool:
    """True when this process's stdout is the file at `path` (the runner's redirect)."""
    try:
        out, log = os.fstat(sys.stdout.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    return (out.st_dev, out.st_ino) == (log.st_dev, log.st_ino)


@contextlib.contextmanager
def tee_to_log(path: Path) -> Iterator[None]:
    """Copy sys.stdout and sys.stderr into `path` (appending, created 0600) for the block."""
    if already_logging_to(path):
        yield
        return
    log = open_private(path, "a", encoding="utf-8")
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(saved[0], log), _Tee(saved[1], log)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        with contextlib.suppress(OSError):
            log.close()
