"""Streaming, bounded readers for dataset files (.jsonl, .json, .csv, .parquet).

Each reader yields `(number, row, where)` for a good row (`where` names it for messages: "row 3 (line
5)") and a `Problem` for a bad one, reading the file
piece by piece: no row is held in memory beyond the row size limit (default 1 MB, or
$FUSETUNE_MAX_ROW_BYTES), so a 50 MB row is refused by its number, not loaded, and a preview that
takes the first rows reads only those. Rows are counted from 1 (a CSV's header and a JSONL's blank
lines are not rows); messages also name the line where there are lines."""
from __future__ import annotations

import codecs
import csv
import json
from pathlib import Path
from typing import Any, Iterator

from jobs.messages import say
from jobs.data.conversation import DataError
from jobs.data.json_stream import json_array_rows, too_deep, too_deep_message
from jobs.data.problems import (MAX_ROW_BYTES_ENV, Problem, max_row_bytes,  # noqa: F401  (re-exported)
                                not_utf8, too_large)

CHUNK = 1 << 16


def iter_rows(path: str | Path, limit: int | None = None) -> Iterator[tuple[int, Any, str] | Problem]:
    """Every row of a data file in order, or a Problem in its place. Raises DataError only for what
    makes the whole file unreadable (not Parquet, empty, unknown type)."""
    path, limit = Path(path), max_row_bytes(limit)
    readers = {".jsonl": _jsonl_rows, ".json": _json_rows, ".csv": _csv_rows, ".parquet": _parquet_rows}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise DataError(say("unsupported_file_type", name=path.name, choices=", ".join(readers)))
    return reader(path, limit)


def _jsonl_rows(path: Path, limit: int) -> Iterator[tuple[int, Any, str] | Problem]:
    with open(path, "rb") as fh:
        offset, line_number, number = 0, 0, 0
        while True:
            line = fh.readline(limit + 1)  # bounded: never more than the limit in memory
            if not line:
                return
            line_number, start = line_number + 1, offset
            offset += len(line)
            if line_number == 1 and line.startswith(codecs.BOM_UTF8):
                line = line[len(codecs.BOM_UTF8):]
            if not line.strip():
                continue  # a blank line is not a row
            number += 1
            where = say("at_row_line", number=number, line=line_number)
            if len(line.rstrip(b"\r\n")) > limit:
                skipped = 0 if line.endswith(b"\n") else _skip_line(fh)
                offset += skipped
                yield Problem(number, too_large(where, len(line) + skipped, limit))
                continue
            yield _jsonl_row(line, number, where, start)


def _jsonl_row(line: bytes, number: int, where: str, start: int) -> tuple[int, Any, str] | Problem:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Problem(number, not_utf8(where, start + exc.start))
    if too_deep(line):
        return Problem(number, too_deep_message(where))
    try:  # without its line end: an error at the end of the line would be reported as column 1 of the next
        return number, json.loads(text.rstrip("\r\n")), where
    except json.JSONDecodeError as exc:
        return Problem(number, say("row_not_json_column", where=where, column=exc.colno, detail=exc.msg))


def _skip_line(fh) -> int:
    """Read past the rest of the current line without keeping it; returns the bytes skipped."""
    skipped = 0
    while True:
        chunk = fh.readline(CHUNK)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped


def _json_rows(path: Path, limit: int) -> Iterator[tuple[int, Any, str] | Problem]:
    with open(path, "rb") as fh:
        yield from json_array_rows(fh, path.name, limit)


class _LineTooLarge(Exception):
    def __init__(self, size: int, balanced: bool):
        super().__init__(size)
        self.size, self.balanced = size, balanced


class _LineNotUtf8(Exception):
    def __init__(self, offset: int):
        super().__init__(offset)
        self.offset = offset


class _BoundedLines:
    """Decoded lines of a binary file for csv.reader, each read with a bounded readline. Raises
    (resumably: this is a class, not a generator) for a line over the limit or not in UTF-8, and
    when one CSV record, across its lines, grows past the limit."""

    def __init__(self, fh, limit: int):
        self.fh, self.limit = fh, limit
        self.offset, self.line_number, self.record_bytes = 0, 0, 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = self.fh.readline(self.limit + 1)
        if not line:
            raise StopIteration
        self.line_number += 1
        start, self.offset = self.offset, self.offset + len(line)
        if self.line_number == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8):]
        self.record_bytes += len(line)
        ending = len(line) - len(line.rstrip(b"\r\n"))
        if self.record_bytes - ending > self.limit:
            single_line = self.record_bytes == len(line)
            skipped, quotes = (0, 0) if ending else _skip_counting_quotes(self.fh)
            self.offset += skipped
            quotes += line.count(b'"')
            raise _LineTooLarge(self.record_bytes + skipped, balanced=single_line and quotes % 2 == 0)
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _LineNotUtf8(start + exc.start) from None


def _skip_counting_quotes(fh) -> tuple[int, int]:
    skipped = quotes = 0
    while True:
        chunk = fh.readline(CHUNK)
        skipped, quotes = skipped + len(chunk), quotes + chunk.count(b'"')
        if not chunk or chunk.endswith(b"\n"):
            return skipped, quotes


def _csv_rows(path: Path, limit: int) -> Iterator[tuple[int, Any, str] | Problem]:
    with open(path, "rb") as fh:
        lines = _BoundedLines(fh, limit)
        header = _csv_header(path, lines)
        number = 0
        reader = csv.reader(lines)
        while True:
            lines.record_bytes = 0
            first_line = lines.line_number + 1
            try:
                record = next(reader)
            except StopIteration:
                return
            except (_LineTooLarge, _LineNotUtf8, csv.Error) as exc:
                number += 1
                where = say("at_row_line", number=number, line=first_line)
                yield Problem(number, _csv_problem(where, exc, limit))
                if isinstance(exc, _LineTooLarge) and not exc.balanced:
                    yield Problem(number, say("rows_after_unchecked", where=where))
                    return
                reader = csv.reader(lines)  # a fresh parser state from the next line on
                continue
            if not record:
                continue  # blank line
            number += 1
            if len(record) != len(header):
                yield Problem(number, say("row_field_count", where=say("at_row_line", number=number, line=first_line),
                                          count=len(record), header_count=len(header), header=", ".join(header)))
                continue
            yield number, dict(zip(header, record)), say("at_row_line", number=number, line=first_line)


def _csv_header(path: Path, lines: _BoundedLines) -> list[str]:
    try:
        header = next(csv.reader(lines), None)
    except _LineNotUtf8 as exc:
        raise DataError(not_utf8(say("at_header_line", name=path.name), exc.offset)) from None
    except (_LineTooLarge, csv.Error) as exc:
        problem = _csv_problem("it", exc, lines.limit)
        raise DataError(say("csv_header_unreadable", name=path.name, problem=problem)) from None
    if not header or not any(name.strip() for name in header):
        raise DataError(say("csv_empty", name=path.name))
    return [name.strip() for name in header]


def _csv_problem(where: str, exc: Exception, limit: int) -> str:
    if isinstance(exc, _LineTooLarge):
        return too_large(where, exc.size, limit)
    if isinstance(exc, _LineNotUtf8):
        return not_utf8(where, exc.offset)
    return say("row_not_csv", where=where, detail=exc)


def _parquet_rows(path: Path, limit: int, batch_rows: int = 64) -> Iterator[tuple[int, Any, str] | Problem]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(say("not_parquet", name=path.name, detail=exc)) from None
    number = 0
    with parquet:
        for batch in parquet.iter_batches(batch_size=batch_rows):
            for index in range(batch.num_rows):
                number += 1
                one = batch.slice(index, 1)
                size = sum(column.nbytes for column in one.columns)
                if size > limit:
                    yield Problem(number, too_large(say("at_row", number=number), size, limit))
                else:
                    yield number, _plain(one.to_pylist()[0]), say("at_row", number=number)


def _plain(value: Any) -> Any:
    """numpy / arrow values into plain lists, dicts and scalars."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
