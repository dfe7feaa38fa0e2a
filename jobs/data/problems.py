"""A bad row in words: the Problem a reader yields in its place, and the row size limit.

Shared by the readers (jobs/data/readers.py) and the JSON array streamer (jobs/data/json_stream.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from jobs.messages import say
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
        raise DataError(say("max_row_bytes_not_number", env=MAX_ROW_BYTES_ENV, raw=raw)) from None
    if value < 1:
        raise DataError(say("max_row_bytes_too_small", env=MAX_ROW_BYTES_ENV, raw=raw))
    return value


def too_large(where: str, size: int | str, limit: int) -> str:
    size_text = say("byte_count", count=size) if isinstance(size, int) else size
    return say("row_too_large", where=where, size=size_text, limit=limit, env=MAX_ROW_BYTES_ENV)


def not_utf8(where: str, offset: int) -> str:
    return say("row_not_utf8", where=where, offset=offset)
