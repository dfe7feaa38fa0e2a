"""Bounded streaming readers: every file type row by row, bad rows named by number, rows over the
size limit refused without being loaded, and a preview of a huge file that stays small in memory."""
import json
import os
import subprocess
import sys

import pytest

from jobs.data.conversation import DataError
from jobs.data.dataset import scan_rows
from jobs.data.readers import MAX_ROW_BYTES_ENV, Problem, iter_rows, max_row_bytes
from tests.conftest import ROOT

ROW = {"instruction": "Add", "input": "2+2", "output": "4"}


def _items(path, limit=None):
    return [str(x) if isinstance(x, Problem) else x[:2] for x in iter_rows(path, limit)]


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_row_limit_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(MAX_ROW_BYTES_ENV, raising=False)
    assert max_row_bytes() == 1 << 20
    monkeypatch.setenv(MAX_ROW_BYTES_ENV, "4096")
    assert max_row_bytes() == 4096 and max_row_bytes(10) == 10
    monkeypatch.setenv(MAX_ROW_BYTES_ENV, "lots")
    with pytest.raises(DataError, match=MAX_ROW_BYTES_ENV):
        max_row_bytes()


def test_jsonl_names_each_bad_line_and_keeps_reading(tmp_path):
    lines = [json.dumps(ROW).encode(), b"{broken", b"", b'{"output": "' + b"x" * 300 + b'"}',
             b'{"output": "caf\xe9"}', json.dumps(ROW).encode()]
    path = _write(tmp_path, "d.jsonl", b"\n".join(lines))
    got = _items(path, limit=200)
    assert got[0] == (1, ROW) and got[-1] == (5, ROW)  # the blank line is not a row
    assert got[1].startswith("row 2 (line 2) is not valid JSON")
    assert got[2].startswith("row 3 (line 4) is 3") and "over the row size limit of 200 bytes" in got[2]
    offset = sum(len(line) + 1 for line in lines[:4]) + len(b'{"output": "caf')
    assert got[3] == (f"row 4 (line 5) is not UTF-8 text (undecodable byte at offset {offset:,} of the file): "
                      "save the file as UTF-8")
    assert [x[2] for x in iter_rows(path, 200) if not isinstance(x, Problem)] == ["row 1 (line 1)", "row 5 (line 6)"]


@pytest.mark.parametrize("chunk", [3, 1 << 16])
def test_json_array_is_read_row_by_row_at_any_chunk_size(tmp_path, monkeypatch, chunk):
    import jobs.data.json_stream
    monkeypatch.setattr(jobs.data.json_stream, "CHUNK", chunk)
    big = {"output": "y" * 500, "note": "a ] and a \" and a \\ inside"}
    text = json.dumps({"train": [ROW, big, ROW, 7]}, indent=1).encode()
    got = _items(_write(tmp_path, "d.json", text), limit=300)
    assert got[0] == (1, ROW) and got[2] == (3, ROW) and got[3] == (4, 7)
    assert got[1].startswith("row 2 (line ") and "over the row size limit of 300 bytes" in got[1]


def test_json_structure_errors_name_the_row_and_line(tmp_path):
    missing_comma = _items(_write(tmp_path, "a.json", b'[{"a": 1},\n {"a": 2}\n {"a": 3}]'))
    assert missing_comma[-1] == ("a.json: after row 2 (line 2) comes '{', not ',' or ']': a comma or the "
                                 "closing bracket is missing")
    bad_row = _items(_write(tmp_path, "b.json", b'[{"a": 1},\n{"a" 2},\n{"a": 3}]'))
    assert bad_row == [(1, {"a": 1}), "row 2 (line 2) is not valid JSON: Expecting ':' delimiter", (3, {"a": 3})]
    cut = _items(_write(tmp_path, "c.json", b'[{"a": 1}, {"a": "'))
    assert "ends inside row 2" in cut[-1]
    for data in (b"", b"  ", b'{"instruction": "x"}', b"hello"):
        with pytest.raises(DataError, match="must hold a list of rows|is empty"):
            _items(_write(tmp_path, "e.json", data))


def test_csv_rows_fields_encodings_and_limits(tmp_path):
    data = (b"instruction,input,output\n"
            b"Add,2+2,4\n"
            b"too,many,fields,here\n"
            b'"multi\nline",,ok\n'
            b"bad,\xff,x\n"
            b"big," + b"z" * 300 + b",x\n"
            b"\n"
            b"Add,2+2,4\n")
    got = _items(_write(tmp_path, "d.csv", data), limit=200)
    assert got[0] == (1, ROW)
    assert got[1] == "row 2 (line 3) has 4 fields; the header has 3 (instruction, input, output)"
    assert got[2] == (3, {"instruction": "multi\nline", "input": "", "output": "ok"})
    assert got[3].startswith("row 4 (line 6) is not UTF-8 text (undecodable byte at offset")
    assert got[4].startswith("row 5 (line 7) is 3") and "row size limit of 200 bytes" in got[4]
    assert got[5] == (6, ROW)


@pytest.mark.parametrize("data", [b"", b"\n\n", b"\xef\xbb\xbf"])
def test_empty_csv_is_refused_saying_what_a_csv_needs(tmp_path, data):
    with pytest.raises(DataError, match="d.csv is empty: a CSV needs a header line"):
        _items(_write(tmp_path, "d.csv", data))


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    path = _write(tmp_path, "d.parquet", json.dumps([ROW]).encode())
    with pytest.raises(DataError, match="d.parquet is not a Parquet file"):
        _items(path)


def test_parquet_rows_over_the_limit_are_refused_by_number(tmp_path):
    import pandas as pd
    rows = [ROW, {**ROW, "output": "w" * 5000}, ROW]
    path = tmp_path / "d.parquet"
    pd.DataFrame(rows).to_parquet(path)
    got = _items(path, limit=1000)
    assert got[0] == (1, ROW) and got[2] == (3, ROW)
    assert got[1].startswith("row 2 is 5,0") and "row size limit of 1,000 bytes" in got[1]


def test_scan_collects_every_bad_row_and_shows_the_first_ten(tmp_path):
    lines = [json.dumps(ROW) if i % 3 else "[1]" for i in range(1, 61)]
    path = _write(tmp_path, "d.jsonl", "\n".join(lines).encode())
    rows, problems = scan_rows(str(path))
    assert len(rows) == 40 and problems.count == 20
    message = str(problems.error("d.jsonl"))
    assert message.startswith("d.jsonl has 20 bad rows (the first 10 shown): row 3 (line 3) is a list")
    assert "row 30 (line 30) is a list" in message and "row 33" not in message


HUGE_ROW_PREVIEW = r"""
import json, sys, psutil
from jobs.data import encode
from jobs.data.dataset import scan_rows
process = psutil.Process()
before = process.memory_info().rss
rows, problems = scan_rows(sys.argv[1], first=int(sys.argv[2]))
after = process.memory_info().rss
print(json.dumps({"grew_mb": (after - before) / 2**20, "rows": len(rows), "problems": problems.shown,
                  "answer_bytes": len(json.dumps(rows)) + len(json.dumps(problems.shown))}))
"""


def _huge_file(tmp_path, suffix: str, huge_first: bool) -> str:
    small = [ROW] * 3
    huge = {**ROW, "output": "h" * (50 * 2**20)}
    rows = [huge] + small if huge_first else small + [huge]
    path = tmp_path / f"huge{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import csv
        with open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(ROW))
            writer.writeheader()
            writer.writerows(rows)
    return str(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_preview_of_a_file_with_a_50mb_row_stays_small(tmp_path, suffix):
    """Issue 12: one 50 MB row cost 8 GB in the studio on Preview. The first rows are read in
    bounded memory: the huge row is refused by number, never loaded, and the answer is small."""
    for huge_first, first in ((True, 3), (False, 4)):
        path = _huge_file(tmp_path, suffix, huge_first)
        proc = subprocess.run([sys.executable, "-c", HUGE_ROW_PREVIEW, path, str(first)], cwd=ROOT,
                              capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["grew_mb"] < 100, result
        assert result["answer_bytes"] < 10_000, result
        assert len(result["problems"]) == 1 and "over the row size limit" in result["problems"][0]
        assert result["rows"] == (2 if huge_first else 3)


STUDIO_PREVIEW = r"""
import json, sys, psutil
from jobs.data.dataset import DataError, preview_rows
from jobs.spec import JobSpec
model, small, huge = sys.argv[1:4]
preview_rows(JobSpec.from_dict({"model": model, "dataset": small}), n=3)  # tokenizer and imports warm
process = psutil.Process()
before = process.memory_info().rss
try:
    answer = json.dumps(preview_rows(JobSpec.from_dict({"model": model, "dataset": huge}), n=3))
except DataError as exc:
    answer = str(exc)
after = process.memory_info().rss
print(json.dumps({"grew_mb": (after - before) / 2**20, "answer": answer[:2000], "answer_bytes": len(answer)}))
"""


@pytest.mark.parametrize("huge_first", [True, False])
def test_studio_preview_of_a_huge_file_keeps_memory_flat(tmp_path, tiny_model, huge_first):
    """The Train tab's Preview (jobs.data.dataset.preview_rows) on a JSONL file with a 50 MB row: the rows
    before it are shown without reading it; a huge first row is refused by its line number."""
    path = _huge_file(tmp_path, ".jsonl", huge_first)
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps(ROW))
    proc = subprocess.run([sys.executable, "-c", STUDIO_PREVIEW, str(tiny_model), str(small), path], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["grew_mb"] < 100, result
    assert result["answer_bytes"] < 20_000
    if huge_first:
        assert result["answer"].startswith("huge.jsonl has 1 bad row: row 1 (line 1) is 52,4")
    else:
        assert '"trained_tokens"' in result["answer"] and result["answer"].count('"segments"') == 3


def test_rows_nested_past_the_limit_are_refused_by_number_before_parsing(tmp_path):
    from jobs.data.json_stream import MAX_NESTING
    deep_list = b"[" * 100_000 + b"]" * 100_000
    deep_dict = b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    fine = {"messages": [{"role": "user", "content": "[[[[ {{{{ " * 50}]}  # brackets in strings do not count
    jsonl = _write(tmp_path, "d.jsonl", b"\n".join([json.dumps(ROW).encode(), deep_list, deep_dict,
                                                    json.dumps(fine).encode()]))
    got = _items(jsonl)
    assert got[0] == (1, ROW) and got[3] == (4, fine)
    for number, text in ((2, got[1]), (3, got[2])):
        assert text == (f"row {number} (line {number}) nests brackets ([ or {{) more than {MAX_NESTING} levels "
                        f"deep, over the nesting limit of {MAX_NESTING}: a row of chat data needs a few levels; "
                        "flatten it or remove it")
    array = _write(tmp_path, "d.json", b"[" + json.dumps(ROW).encode() + b",\n" + deep_list + b",\n"
                   + deep_dict + b"]")
    got = _items(array)
    assert got[0] == (1, ROW) and "row 2 (line 2) nests brackets" in got[1] and "row 3 (line 3) nests" in got[2]
    ok = _write(tmp_path, "ok.jsonl", b"[" * MAX_NESTING + b"]" * MAX_NESTING)
    (number, value), = _items(ok)  # exactly at the limit: parsed
    assert number == 1 and isinstance(value, list)


def test_an_error_at_the_end_of_a_line_names_that_column(tmp_path):
    from jobs.data.readers import _jsonl_row
    problem = _jsonl_row(b'{"a": [1, 2]\n', 3, "row 3 (line 3)", 0)
    assert "(column 13)" in problem.message, problem


def test_the_nesting_scan_counts_depth_not_brackets_and_skips_strings():
    from jobs.data.json_stream import too_deep
    limit = 5
    assert not too_deep(b"[" * limit + b"]" * limit, limit)
    assert too_deep(b"[" * (limit + 1) + b"]" * (limit + 1), limit)
    assert not too_deep(b"[" + b"[], " * 50 + b"[]]", limit)                  # many brackets, two levels
    assert not too_deep(b'{"a": "' + b"[" * 50 + b'"}', limit)               # brackets inside a string
    assert not too_deep(b'{"a": "\\"' + b"{" * 50 + b'"}', limit)            # after an escaped quote too
    assert too_deep(b'{"a": "x", "b": ' + b"{" * limit + b"}" * limit + b"}", limit)
