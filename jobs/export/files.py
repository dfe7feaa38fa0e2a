"""Writing an export so that nothing half-written ever sits under its final name.

Everything is written to a hidden temporary sibling (same folder, so the final rename is atomic on
one filesystem) and renamed into place only when complete; on any failure the temporary is removed,
and so is every folder the export created for it (a refused export leaves no empty folder). An
export of several files (a GGUF and its Modelfile) is written into one temporary folder
(`staged_folder`) that becomes the destination folder. A full disk (or another disk failure,
recognised by jobs.io.storage) is reported as such, and too little free space is refused before
anything is written. What a killed export leaves (`.<name>.partial-<pid>`) is removed at the
studio's next start (jobs/export/leftovers.py)."""
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
    """Refuse before writing anything (no folder made) when the disk cannot hold the export."""
    existing = Path(folder)
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    free = free_bytes(existing)
    if free is not None and free < needed_bytes + MARGIN_BYTES:
        raise ExportError(say("export_no_disk_space", folder=folder, need=human_size(needed_bytes),
                              free=human_size(free)))


def _temporary_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial-{os.getpid()}")


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def make_parents(folder: Path) -> list[Path]:
    """mkdir -p, returning the folders it created (deepest last), for remove_empty on failure."""
    missing = []
    folder = Path(folder)
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
    return list(reversed(missing))


def remove_empty(created: list[Path]) -> None:
    """Remove the folders make_parents created, deepest first, where they are still empty."""
    for path in reversed(created):
        try:
            path.rmdir()
        except OSError:
            return


def _move_into_place(tmp: Path, final: Path) -> None:
    """Rename tmp to final; an existing final is set aside first and removed after."""
    if not final.exists():
        os.replace(tmp, final)
        return
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    remove_path(old)
    os.replace(final, old)
    os.replace(tmp, final)
    remove_path(old)


@contextmanager
def atomic_output(final: Path, folder: bool) -> Iterator[Path]:
    """Yield a temporary path (a created folder, or a file path) that becomes `final` on success."""
    final = Path(final)
    created = make_parents(final.parent)
    tmp = _temporary_name(final)
    remove_path(tmp)
    try:
        if folder:
            tmp.mkdir()
        yield tmp
        _move_into_place(tmp, final)
    except BaseException as exc:
        remove_path(tmp)
        remove_empty(created)
        _raise_disk_error(exc, final)
        raise


@contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """Yield a temporary folder whose files all appear in `final` together, or none of them do: a new
    `final` is the temporary folder renamed; into an existing one (a folder --out named, a repeated
    export) each finished file is renamed in turn from a temporary folder inside it."""
    final = Path(final)
    if not final.is_dir():
        with atomic_output(final, folder=True) as tmp:
            yield tmp
        return
    tmp = _temporary_name(final / "staged")
    remove_path(tmp)
    try:
        tmp.mkdir()
        yield tmp
        for path in sorted(tmp.iterdir()):
            _move_into_place(path, final / path.name)
    except BaseException as exc:
        _raise_disk_error(exc, final)
        raise
    finally:
        remove_path(tmp)


def _raise_disk_error(exc: BaseException, final: Path) -> None:
    """A full disk as an ExportError naming the export (safetensors and torch report it as
    RuntimeError, hence jobs.io.storage's test); anything else is left to the caller."""
    if isinstance(exc, Exception) and not isinstance(exc, ExportError) and is_disk_error(exc):
        raise ExportError(say("export_disk_failed", name=final.name, detail=describe(final, exc))) from exc


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
