"""Uploads on the Train tab: a dataset or reward file moved into the data dir under a safe name, the
datasets the picker lists, and what an uploaded file turned out to be (read from a bounded sample)."""
from __future__ import annotations

import hashlib
import re
import secrets
import shutil
from pathlib import Path

from jobs.io import paths
from jobs.spec import BUILTIN_DATASETS, DATASET_SUFFIXES
from studio import form, render
from studio.i18n import t
from studio.server_text import translated


def safe_upload_name(original: str) -> str:
    """A file name for an uploaded dataset: the original stem reduced to [A-Za-z0-9._-], a random
    tag so two uploads of train.json never collide, and the original (allowed) suffix."""
    path = Path(original)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem).strip("._-")[:60] or "dataset"
    return f"{stem}-{secrets.token_hex(4)}{path.suffix.lower()}"


def content_tag(path: Path) -> str:
    """A short hash of a file's bytes (streamed): the same file uploaded twice has the same tag."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def same_upload(data_dir: Path, tag: str, suffix: str) -> Path | None:
    """An upload already in the data dir with these bytes (named ...-<tag><suffix>), if any."""
    return next(iter(sorted(paths.datasets_dir(data_dir).glob(f"*-{tag}{suffix}"))), None)


def store_upload(data_dir: Path, uploaded: str) -> Path:
    """Move an uploaded file (Gradio's temp path) into <data_dir>/datasets/ and return it there.

    The stored name ends in a hash of the content, so the same file uploaded twice (under any name)
    is the one entry already listed: the second upload is dropped and the first one returned."""
    source = Path(uploaded)
    if source.suffix.lower() == ".zip":   # an image-text dataset: its data file and images (jobs/io/dataset_zip.py)
        return store_zip_upload(data_dir, source)
    if source.suffix.lower() not in DATASET_SUFFIXES:
        raise form.FieldError("dataset", "upload_type", name=source.name,
                              types=", ".join((*DATASET_SUFFIXES, ".zip")))
    tag, suffix = content_tag(source), source.suffix.lower()
    existing = same_upload(data_dir, tag, suffix)
    if existing is not None:
        source.unlink(missing_ok=True)  # nothing left in Gradio's cache either
        return existing
    stem = safe_upload_name(source.name).rsplit("-", 1)[0]
    target = paths.datasets_dir(data_dir) / f"{stem}-{tag}{suffix}"
    partial = target.with_name(f".{target.name}.partial")
    try:  # Gradio's temp copy is moved, not copied: one copy on the disk, and nothing left in its cache
        shutil.move(source, partial)
        partial.rename(target)
    except OSError as exc:
        partial.unlink(missing_ok=True)  # a failed upload leaves nothing behind
        source.unlink(missing_ok=True)
        from jobs.io.storage import as_storage_error
        raise as_storage_error(exc, target) from None
    return target


MAX_UNZIPPED_BYTES = 16 * 2 ** 30   # what an uploaded .zip may unpack to


def store_zip_upload(data_dir: Path, source: Path) -> Path:
    """Unpack an uploaded .zip into <data_dir>/datasets/<name>-<tag>.unzipped/; return its data file."""
    from jobs.io.dataset_zip import ZipRefused, unpack_dataset_zip
    try:
        return unpack_dataset_zip(source, paths.datasets_dir(data_dir), MAX_UNZIPPED_BYTES)
    except ZipRefused as exc:
        raise form.FieldError("dataset", "upload_zip", name=source.name, reason=str(exc)) from None
    except OSError as exc:
        from jobs.io.storage import as_storage_error
        raise as_storage_error(exc, paths.datasets_dir(data_dir)) from None
    finally:
        source.unlink(missing_ok=True)   # Gradio's temp copy: the unpacked files are the dataset now


def known_datasets(data_dir: Path) -> list[str]:
    """The built-in datasets (identity; concise pairs; grpo's prompt tasks), then every upload in the data dir."""
    from jobs.io.dataset_zip import unpacked_data_files
    files = sorted(p for p in paths.datasets_dir(data_dir).glob("*") if p.suffix.lower() in DATASET_SUFFIXES)
    files += unpacked_data_files(paths.datasets_dir(data_dir))
    return list(BUILTIN_DATASETS) + [str(p) for p in files]


def store_reward_upload(data_dir: Path, uploaded: str) -> Path:
    """Copy an uploaded reward file into <data_dir>/rewards/uploads/; refused unless the studio was
    started with --allow-reward-code (a reward file is code every job that names it runs). Kept apart
    from the operator's own rewards/ files, so that a later start without the flag runs none of them
    (jobs/checks/reward_code.py)."""
    from jobs.checks.reward_code import reward_uploads_allowed, reward_uploads_dir
    source = Path(uploaded)
    if not reward_uploads_allowed():
        raise form.FieldError("reward_file", "reward_upload_off")
    if source.suffix.lower() != ".py":
        raise form.FieldError("reward_file", "upload_type", name=source.name, types=".py")
    folder = reward_uploads_dir(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / safe_upload_name(source.name)
    shutil.copyfile(source, target)
    return target


UPLOAD_SAMPLE_ROWS = 2000   # rows an upload notice reads; Start (the preflight child) reads them all


def describe_dataset(path: Path, lang: str = "en") -> tuple[str, int | None, bool]:
    """(detected format, row count, whether the count is exact) of a data file, from a bounded
    sample read the way training reads it: the studio never holds a whole dataset. Past the sample,
    the count is estimated from the file's lines (streamed) or Parquet's metadata; None for a JSON
    array. Bad rows past the sample are for Start's check (studio/preflight_child.py) to name. A
    preference file says so first ("preference rows (explicit)"): its pairs may also look like sharegpt."""
    from jobs.data import dataset as data  # pandas & co: imported on first use, not with the UI
    from jobs.data.cache import estimate_rows
    rows, problems = data.scan_rows(str(path), first=UPLOAD_SAMPLE_ROWS + 1)
    error = problems.error(rows.name)
    if error:
        raise error
    if not rows:
        raise data.DataError(f"{rows.name} has no rows: add at least one example")
    fmt = _row_format(rows, lang)
    if len(rows) + problems.count <= UPLOAD_SAMPLE_ROWS:
        return fmt, len(rows), True
    return fmt, estimate_rows(path), False


def _row_format(rows, lang: str) -> str:
    """What the first row is: preference rows (their kind), an SFT format, or GRPO prompt rows (a
    prompt and the columns its rewards read, e.g. prompt/answer: TRL's GRPO "prompt" column)."""
    from jobs.data import dataset as data
    from jobs.data.preference import preference_format
    from jobs.data.prompts import is_prompt_row
    kind = preference_format(rows[0])
    if kind is not None:
        return t("train.preference_format", lang, kind=kind)
    try:
        return data.detect_format(rows)
    except data.DataError:
        if not is_prompt_row(rows[0]):
            raise
        return t("train.prompt_format", lang)


def upload_notice(path: Path, lang: str) -> str:
    """What an upload turned out to be: its format and row count, or why it cannot be read."""
    from jobs.data import dataset as data
    try:
        fmt, count, exact = describe_dataset(path, lang)
    except (data.DataError, OSError, ValueError) as exc:
        return render.notice_html(t("train.upload_unreadable", lang, name=path.name, error=translated(str(exc), lang)),
                                  "error")
    if exact:
        return render.notice_html(t("train.upload_ok", lang, name=path.name, format=fmt, rows=f"{count:,}"), "ok")
    sample = f"{UPLOAD_SAMPLE_ROWS:,}"
    if count is None:
        return render.notice_html(t("train.upload_ok_more", lang, name=path.name, format=fmt, sample=sample), "ok")
    return render.notice_html(t("train.upload_ok_estimated", lang, name=path.name, format=fmt, sample=sample,
                                rows=f"{count:,}"), "ok")
