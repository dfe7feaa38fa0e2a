"""A bad row in words: the Problem a reader yields in its place, and the row size limit.

Shared by the readers (jobs/data/readers.py) and the JSON array streamer (jobs/data/json_stream.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from jobs.data.conversation import DataError

DEFAULT_MAX_ROW_BYTES = 1 << 20
MAX_ROW_BYTES_ENV = "FUSETUNE_MAX_ROW_BYTES"


@dataclass
class Problem:
    """One bad row: its number (for ordering) and a sentence that names where it is."""
    number: int
    message: str

    def __str__(self) -> str:
        return self.message


def max_row_bytes(explicit: int | None = None) -> int:
    """The row size limit: the argument, else $FUSETUNE_MAX_ROW_BYTES, else 1 MB."""
    if explicit is not None:
        return int(explicit)
    raw = os.environ.get(MAX_ROW_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_ROW_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise DataError(f"{MAX_ROW_BYTES_ENV}={raw!r} is not a whole number of bytes") from None
    if value < 1:
        raise DataError(f"{MAX_ROW_BYTES_ENV}={raw!r} must be at least 1")
    return value


def too_large(where: str, size: int | str, limit: int) -> str:
    size_text = f"{size:,} bytes" if isinstance(size, int) else size
    return (f"{where} is {size_text}, over the row size limit of {limit:,} bytes: split or shorten it "
            f"(or raise {MAX_ROW_BYTES_ENV})")


def not_utf8(where: str, offset: int) -> str:
    return (f"{where} is not UTF-8 text (undecodable byte at offset {offset:,} of the file): "
            "save the file as UTF-8")
