"""Writing to disk safely: private files, folders written whole or not at all, and disk errors
(full, read-only, no permission, failing) reported with the path, the free space and the fix.

A disk error is not a bug in the job, so it gets its own error kind ("io") instead of an
"internal" traceback. torch and safetensors do not raise OSError when a write fails (torch says
"[enforce fail at inline_container.cc] ... file write failed", safetensors wraps the Rust io
error), so those messages are recognised here too."""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Iterator

PRIVATE_UMASK = 0o077  # files 0600, folders 0700: job data, uploads and caches are the user's alone
FILE_MODE, DIR_MODE = 0o600, 0o700

DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EACCES, errno.EPERM,
               errno.EFBIG, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG}
# Messages of write failures that reach us as RuntimeError: torch's zip writer ("file write failed",
# or "basic_ios::clear: iostream error" followed by "unexpected pos N vs M" when a write(2) fails
# under it, seen with a file size limit) and safetensors (the Rust io error's text).
_WRITE_FAILURE_MARKS = ("No space left on device", "file write failed", "PytorchStreamWriter failed",
                        "iostream error", "unexpected pos", "Disk quota exceeded", "StorageFull",
                        "Read-only file system", "(os error ")
# Writers that raise something other than OSError/RuntimeError on a failed write: safetensors'
# SafetensorError ("Error while serializing: I/O error: No space left on device (os error 28)") and
# the tokenizers library, whose Tokenizer.save raises a bare Exception("No space left on device (os
# error 28)"). Matched by type name so that safetensors need not be imported here; a ValueError or
# any other library's exception with such a text is still not taken for the disk.
_WRITER_EXCEPTION_NAMES = {"RuntimeError", "SafetensorError", "Exception"}
_RUST_ERRNO = re.compile(r"\(os error (\d+)\)")  # the Rust std::io::Error text: "... (os error 28)"

_NO_PERMISSION = "no permission to write there: fix the folder's permissions, or choose another output_dir / --data-dir"
_FIXES = {
    errno.ENOSPC: "free some space on that disk, or choose an output_dir / --data-dir on another disk",
    errno.EDQUOT: "your disk quota is used up: free some space, or choose an output_dir on another disk",
    errno.EROFS: "that file system is read-only: choose a writable output_dir / --data-dir",
    errno.EACCES: _NO_PERMISSION,
    errno.EPERM: _NO_PERMISSION,
    errno.EIO: "the disk reported an I/O error: check the disk (dmesg) before training again",
}


class StorageError(OSError):
    """A write that failed because of the disk; str() is one line for people."""

    def __init__(self, path: str | os.PathLike, cause: BaseException, action: str = "write"):
        super().__init__(_errno_of(cause, path), describe(path, cause, action), str(path))
        self.path = str(path)

    def __str__(self) -> str:
        return self.strerror


def is_disk_error(exc: BaseException | None, depth: int = 0) -> bool:
    """True for a failure of the disk, also when it is the cause of the exception raised."""
    if exc is None or depth > 5:
        return False
    if isinstance(exc, StorageError):
        return True
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
        return True
    if _is_writer_failure(exc):
        return True
    return is_disk_error(exc.__cause__ or exc.__context__, depth + 1)


def _is_writer_failure(exc: BaseException) -> bool:
    """A write failure reported by torch, safetensors or tokenizers in their own exception type."""
    named = isinstance(exc, RuntimeError) or type(exc).__name__ in _WRITER_EXCEPTION_NAMES
    if not named or not any(mark in str(exc) for mark in _WRITE_FAILURE_MARKS):
        return False
    rust = _RUST_ERRNO.search(str(exc))
    return rust is None or int(rust.group(1)) in DISK_ERRNOS


def as_storage_error(exc: BaseException, path: str | os.PathLike, action: str = "write") -> StorageError:
    """`exc` as a StorageError naming the file it failed on (its own filename when it has one)."""
    if isinstance(exc, StorageError):
        return exc
    return StorageError(getattr(exc, "filename", None) or path, exc, action)


LOW_SPACE_BYTES = 64 * 1024 ** 2  # a failed write with less than this free: the disk is full


def _errno_of(exc: BaseException, path: str | os.PathLike) -> int:
    """The errno behind a failure; torch's writer hides it, so a nearly full disk stands for ENOSPC."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    text = str(exc)
    rust = _RUST_ERRNO.search(text)
    if rust and int(rust.group(1)) in DISK_ERRNOS:
        return int(rust.group(1))
    if "No space left" in text or "StorageFull" in text:
        return errno.ENOSPC
    if "Read-only file system" in text:
        return errno.EROFS
    free = free_bytes(path)
    return errno.ENOSPC if free is not None and free < LOW_SPACE_BYTES else errno.EIO


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free space on the disk holding `path` (or its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def human_bytes(count: int | None) -> str:
    if count is None:
        return "unknown"
    size = float(count)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def describe(path: str | os.PathLike, exc: BaseException, action: str = "write") -> str:
    """'cannot write PATH: REASON (N free on that disk); FIX' on one line."""
    code = _errno_of(exc, path)
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    elif code == errno.EIO:
        reason = f"the write failed ({str(exc).splitlines()[0][:160]})"
    else:
        reason = os.strerror(code)
    fix = _FIXES.get(code, "check that the disk is writable and has space")
    return f"cannot {action} {path}: {reason} ({human_bytes(free_bytes(path))} free on that disk); {fix}"


def make_private_dir(path: str | os.PathLike) -> Path:
    """Create `path` (and parents) as 0700 folders; an existing folder is left as it is."""
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return path


def open_private(path: str | os.PathLike, mode: str = "a", encoding: str | None = None):
    """open() for a file created 0600 whatever the process umask is."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    return os.fdopen(fd, mode, encoding=encoding)


def write_private_text(path: str | os.PathLike, text: str) -> Path:
    """Replace a small private file as a whole: written beside it, then renamed over it, so a
    reader sees the old text or the new, never a truncated file (a job's ranks read config.yaml
    while rank 0 rewrites it: a reader of the half-written file failed its rank, seen in CI)."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open_private(staging, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            staging.unlink()
        raise
    return path


def replace_dir(staging: Path, final: Path) -> None:
    """Put the finished `staging` folder at `final`. The old `final` is moved aside first and
    deleted only after the rename, so a reader sees the old folder or the new one, never a mix."""
    aside = final.with_name(f".{final.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    if final.exists():
        final.rename(aside)
    staging.rename(final)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(final: Path, staging: Path) -> Iterator[Path]:
    """Write a folder as a whole: yields an empty `staging` folder; when the block succeeds it
    replaces `final`; when it fails the staging folder is removed (no `.partial` left behind),
    `final` is untouched, and a disk failure is raised as a StorageError."""
    final, staging = Path(final), Path(staging)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        make_private_dir(staging)
        yield staging
        replace_dir(staging, final)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_error(exc):
            raise as_storage_error(exc, staging) from exc
        raise
