"""An uploaded .zip holding an image-text dataset (its JSONL, JSON, CSV or Parquet file and the
images it names) unpacked into the data dir, safely:

- no member may escape the folder: absolute names, `..` parts, drive letters and symlinks are
  refused (the "zip slip" of Snyk's 2018 advisory), and each member is written by its checked name;
- the sum of the members' sizes is bounded (`max_bytes`) before anything is written, and each
  member is copied at most its declared size (a zip bomb cannot write more than it declares);
- exactly one data file, so the job knows which one to read; the images lie next to it, where
  jobs/data/vision.py resolves relative image paths.

The archive is unpacked into `<datasets>/<name>-<tag>.unzipped/` through a hidden partial
folder, renamed when complete: a failed unpack leaves nothing behind."""
from __future__ import annotations

import re
import secrets
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

from jobs.messages import say

DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")
MAX_MEMBERS = 200_000
UNZIPPED = ".unzipped"


class ZipRefused(ValueError):
    """Why an uploaded archive is not unpacked (a message for people)."""


def _member_path(info: zipfile.ZipInfo) -> PurePosixPath | None:
    """The member's checked relative path (None for a folder entry); ZipRefused for an unsafe one."""
    name = info.filename.replace("\\", "/")
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise ZipRefused(say("zip_symlink", member=info.filename))
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", name):
        raise ZipRefused(say("zip_outside", member=info.filename))
    if info.is_dir():
        return None
    if path.parts and path.parts[0] == "__MACOSX":
        return None   # macOS Finder's resource forks: not part of the dataset
    return path


def plan_members(archive: zipfile.ZipFile, max_bytes: int) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    members = []
    total = 0
    for info in archive.infolist():
        path = _member_path(info)
        if path is None:
            continue
        total += info.file_size
        if total > max_bytes:
            raise ZipRefused(say("zip_too_big", megabytes=max_bytes / 2 ** 20))
        members.append((info, path))
        if len(members) > MAX_MEMBERS:
            raise ZipRefused(say("zip_too_many_files", limit=MAX_MEMBERS))
    return members


def _data_file(members) -> PurePosixPath:
    data = [path for _, path in members if path.suffix.lower() in DATA_SUFFIXES]
    if len(data) != 1:
        found = ", ".join(str(p) for p in data[:5]) or say("zip_none_found")
        raise ZipRefused(say("zip_data_files", suffixes=", ".join(DATA_SUFFIXES), count=len(data), found=found))
    return data[0]


def _copy_bounded(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with archive.open(info) as source, open(target, "wb") as out:
        left = info.file_size
        while True:
            chunk = source.read(min(1 << 20, left + 1))
            if not chunk:
                break
            left -= len(chunk)
            if left < 0:
                raise ZipRefused(say("zip_member_grows", member=info.filename))
            out.write(chunk)


def unpack_dataset_zip(zip_path: Path, datasets_dir: Path, max_bytes: int, name: str | None = None) -> Path:
    """Unpack `zip_path` into a new folder under `datasets_dir`; return its data file's path."""
    try:
        archive = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ZipRefused(say("zip_unreadable", name=Path(zip_path).name, detail=exc)) from None
    with archive:
        members = plan_members(archive, max_bytes)
        data = _data_file(members)
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name or zip_path).stem).strip("._-")[:60] or "dataset"
        folder = Path(datasets_dir) / f"{stem}-{secrets.token_hex(4)}{UNZIPPED}"
        partial = folder.with_name(f".{folder.name}.partial")
        try:
            for info, path in members:
                _copy_bounded(archive, info, partial.joinpath(*path.parts))
            partial.rename(folder)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return folder.joinpath(*data.parts)


def unpacked_data_files(datasets_dir: Path) -> list[Path]:
    """The data files of every unpacked archive (for the dataset picker)."""
    found = []
    for folder in sorted(Path(datasets_dir).glob(f"*{UNZIPPED}")):
        found += [p for p in folder.rglob("*") if p.suffix.lower() in DATA_SUFFIXES and p.is_file()]
    return found
