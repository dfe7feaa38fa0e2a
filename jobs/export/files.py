"""Writing an export so that nothing half-written ever sits under its final name.

Everything is written to a hidden temporary sibling (same folder, so the final rename is atomic on
one filesystem) and renamed into place only when complete; on any failure the temporary is removed.
A full disk (or another disk failure, recognised by jobs.io.storage) is reported as such, and too
little free space is refused before anything is written."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from jobs.messages import say
from jobs.io.storage import describe, free_bytes, human_bytes, is_disk_error

Progress = Callable[[float, str], None]
MARGIN_BYTES = 64 * 1024 ** 2


class ExportError(RuntimeError):
    """An export that cannot be made; the message says why and what to do."""


def no_progress(_fraction: float, _message: str) -> None:
    return None


def human_size(n_bytes: float) -> str:
    return human_bytes(int(n_bytes))


def check_free_space(folder: Path, needed_bytes: int) -> None:
    """Refuse before writing anything when the disk cannot hold the export."""
    folder.mkdir(parents=True, exist_ok=True)
    free = free_bytes(folder)
    if free is not None and free < needed_bytes + MARGIN_BYTES:
        raise ExportError(say("export_no_disk_space", folder=folder, need=human_size(needed_bytes),
                              free=human_size(free)))


def _temporary_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial-{os.getpid()}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _move_into_place(tmp: Path, final: Path) -> None:
    """Rename tmp to final; an existing final is set aside first and removed after."""
    if not final.exists():
        os.replace(tmp, final)
        return
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    _remove(old)
    os.replace(final, old)
    os.replace(tmp, final)
    _remove(old)


@contextmanager
def atomic_output(final: Path, folder: bool) -> Iterator[Path]:
    """Yield a temporary path (a created folder, or a file path) that becomes `final` on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(final)
    _remove(tmp)
    if folder:
        tmp.mkdir()
    try:
        yield tmp
        _move_into_place(tmp, final)
    except BaseException as exc:
        _remove(tmp)
        # safetensors and torch report a full disk as RuntimeError, hence jobs.io.storage's test
        if isinstance(exc, Exception) and not isinstance(exc, ExportError) and is_disk_error(exc):
            raise ExportError(say("export_disk_failed", name=final.name, detail=describe(final, exc))) from exc
        raise


def tree_size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass
class ExportResult:
    """What an export wrote (files or folders) and what the user should know about it."""

    files: list[Path]
    notes: list[str] = field(default_factory=list)

    def sizes(self) -> list[tuple[Path, int]]:
        return [(path, tree_size(path)) for path in self.files]

    def summary(self) -> str:
        return "\n".join(f"{path} ({human_size(size)})" for path, size in self.sizes())
