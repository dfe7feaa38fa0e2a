"""The rows of a JSON file (`[{...}, ...]` or `{"train": [{...}, ...]}`) one at a time, in bounded memory.

The file is read in chunks into a small window; the end of each row is found by scanning only the
JSON structure (brackets, commas, strings and their escapes: all ASCII, so scanning bytes is safe in
UTF-8), and only a row within the size limit is decoded and parsed. A larger row is skipped over
without being kept, and reported by number. The idea of scanning token boundaries instead of
parsing the whole document is that of incremental parsers such as ijson; this is the small part of
it a list of rows needs."""
from __future__ import annotations

import codecs
import json
import re
from typing import Any, BinaryIO, Iterator

from jobs.messages import say
from jobs.data.conversation import DataError
from jobs.data.problems import Problem, not_utf8, too_large

CHUNK = 1 << 16
# Python's json module recurses once per nesting level and fails with a RecursionError near 1,000;
# real rows nest a handful of levels (messages: 4), so anything past this is refused as a bad row
# before json.loads sees it.
MAX_NESTING = 100
NESTING = re.compile(rb'\\.|["\[\]{}]', re.DOTALL)
STRUCTURE = re.compile(rb'["\[\]{},]')
IN_STRING = re.compile(rb'["\\]')
WHITESPACE = b" \t\r\n"
LIST_SHAPE = "a list of rows ([{...}, {...}]) or one key holding that list ({\"train\": [...]})"


class _Truncated(Exception):
    """The file ended inside a row."""


class _Window:
    """The unread part of a binary file that is being scanned: `buf`, starting at file offset `base`."""

    def __init__(self, fh: BinaryIO):
        self.fh, self.buf, self.base, self.newlines = fh, b"", 0, 0

    def more(self) -> bool:
        chunk = self.fh.read(CHUNK)
        self.buf += chunk
        return bool(chunk)

    def drop(self, upto: int) -> None:
        """Forget buf[:upto] (counting its newlines, for line numbers)."""
        self.newlines += self.buf.count(b"\n", 0, upto)
        self.buf, self.base = self.buf[upto:], self.base + upto

    def line_at(self, pos: int) -> int:
        return self.newlines + self.buf.count(b"\n", 0, pos) + 1

    def skip_space(self, pos: int) -> int:
        """The position of the next non-space byte (len(buf) at the end of the file)."""
        while True:
            while pos < len(self.buf) and self.buf[pos] in WHITESPACE:
                pos += 1
            if pos < len(self.buf) or not self.more():
                return pos

    def char(self, pos: int) -> bytes:
        return self.buf[pos:pos + 1]


def json_array_rows(fh: BinaryIO, name: str, limit: int) -> Iterator[Any]:
    """Yield (number, value, where) per row, or a readers.Problem for a bad or oversized row."""
    window = _Window(fh)
    window.more()
    if window.buf.startswith(codecs.BOM_UTF8):
        window.drop(len(codecs.BOM_UTF8))
    pos, wrapped = _open_list(window, name)
    number = 0
    while True:
        pos = window.skip_space(pos)
        if window.char(pos) == b"]":
            if number:
                yield Problem(number, say("json_trailing_comma", name=name, number=number, line=window.line_at(pos)))
            pos += 1
            break
        number += 1
        line, start = window.line_at(pos), window.base + pos
        try:
            end, kept = _row_end(window, pos, limit)
        except _Truncated:
            yield Problem(number, say("json_cut_off", name=name, number=number, line=line))
            return
        if kept:
            yield _parse(window.buf[pos:end], number, line, start)
        else:
            where = say("at_row_line", number=number, line=line)
            yield Problem(number, too_large(where, window.base + end - start, limit))
        pos = window.skip_space(end)
        window.drop(pos)
        pos, after = 1, window.char(0)
        if after == b"]":
            break
        if after != b",":
            found = f"{after.decode('latin-1')!r}" if after else "the end of the file"
            yield Problem(number, say("json_no_separator", name=name, number=number, line=line, found=found))
            return
    yield from _close(window, pos, wrapped, name, number)


def _open_list(window: _Window, name: str) -> tuple[int, bool]:
    """Position just inside the row list, and whether it sits in a one-key object."""
    pos = window.skip_space(0)
    first = window.char(pos)
    if first == b"[":
        return pos + 1, False
    if not first:
        raise DataError(say("json_empty", name=name, shape=LIST_SHAPE))
    if first == b"{":
        pos = window.skip_space(pos + 1)
        if window.char(pos) == b'"':
            try:
                pos = _string_end(window, pos + 1)
            except _Truncated:
                raise DataError(say("json_cut_in_first_key", name=name)) from None
            pos = window.skip_space(pos)
            if window.char(pos) == b":":
                pos = window.skip_space(pos + 1)
                if window.char(pos) == b"[":
                    return pos + 1, True
    raise DataError(say("json_not_row_list", name=name, shape=LIST_SHAPE, start=repr(window.buf[:40])))


def _close(window: _Window, pos: int, wrapped: bool, name: str, number: int) -> Iterator[Any]:
    pos = window.skip_space(pos)
    if wrapped:
        if window.char(pos) != b"}":
            yield Problem(number, say("json_after_closing", name=name))
            return
        pos = window.skip_space(pos + 1)
    if window.char(pos):
        yield Problem(number, say("json_text_after_rows", name=name, line=window.line_at(pos)))


def _string_end(window: _Window, pos: int) -> int:
    """Position after the closing quote of a string whose body starts at pos."""
    while True:
        match = IN_STRING.search(window.buf, pos)
        if match and (match.group() == b'"' or match.end() < len(window.buf)):
            if match.group() == b'"':
                return match.end()
            pos = match.end() + 1  # an escape: skip the escaped byte
            continue
        pos = match.start() if match else len(window.buf)
        if not window.more():
            raise _Truncated


def _row_end(window: _Window, pos: int, limit: int) -> tuple[int, bool]:
    """(end, kept): where the row starting at pos ends (relative to the window, which it may have
    slid forward), and False when it was longer than `limit` and so dropped while scanning."""
    start, depth, kept, at = window.base + pos, 0, True, pos
    while True:
        match = STRUCTURE.search(window.buf, at)
        while match:
            token = match.group()
            if token == b'"':
                try:
                    at = _string_end_bounded(window, match.end(), start, limit)
                except _Dropped as moved:
                    kept, at = False, moved.at
                match = STRUCTURE.search(window.buf, at)
                continue
            if token in b"[{":
                depth += 1
            elif depth == 0:  # a ',' or closing bracket of the list ends a scalar row
                return match.start(), kept and window.base + match.start() - start <= limit
            elif token in b"]}":
                depth -= 1
                if depth == 0:
                    return match.end(), kept and window.base + match.end() - start <= limit
            at = match.end()
            match = STRUCTURE.search(window.buf, at)
        at = len(window.buf)
        if window.base + at - start > limit:
            kept = False
            window.drop(at)
            at = 0
        if not window.more():
            raise _Truncated


class _Dropped(Exception):
    def __init__(self, at: int):
        super().__init__(at)
        self.at = at


def _string_end_bounded(window: _Window, pos: int, start: int, limit: int) -> int:
    """Like _string_end, but a string that takes the row past `limit` is forgotten as it is
    scanned; raises _Dropped (with the position after the string) when that happened."""
    dropped = False
    while True:
        match = IN_STRING.search(window.buf, pos)
        if match and (match.group() == b'"' or match.end() < len(window.buf)):
            if match.group() == b'"':
                if dropped:
                    raise _Dropped(match.end())
                return match.end()
            pos = match.end() + 1
            continue
        pos = match.start() if match else len(window.buf)
        if window.base + pos - start > limit:
            dropped = True
            window.drop(pos)
            pos = 0
        if not window.more():
            raise _Truncated


def too_deep(raw: bytes, limit: int = MAX_NESTING) -> bool:
    """Whether the JSON text nests brackets deeper than `limit`, found by scanning its bytes (strings
    and their escapes skipped), so that a hostile row never reaches the recursive parser."""
    if raw.count(b"[") + raw.count(b"{") <= limit:   # cannot nest deeper than it opens: no scan (most rows)
        return False
    depth, in_string = 0, False
    for match in NESTING.finditer(raw):
        token = match.group()
        if token == b'"':
            in_string = not in_string
        elif in_string or len(token) == 2:
            continue
        elif token in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def too_deep_message(where: str, limit: int = MAX_NESTING) -> str:
    return say("row_too_deep", where=where, limit=limit)


def _parse(raw: bytes, number: int, line: int, start: int) -> Any:
    if too_deep(raw):
        return Problem(number, too_deep_message(say("at_row_line", number=number, line=line)))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Problem(number, not_utf8(say("at_row_line", number=number, line=line), start + exc.start))
    try:
        return number, json.loads(text), say("at_row_line", number=number, line=line)
    except json.JSONDecodeError as exc:
        return Problem(number, say("row_not_json", where=say("at_row_line", number=number, line=line + exc.lineno - 1),
                                   detail=exc.msg))
