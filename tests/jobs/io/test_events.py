"""events.jsonl: the writer's schema checks, a reader that survives damaged files, and resumed runs
that append to the same file without repeating steps."""
import pytest

from jobs.io.events import ERROR_KINDS, EventWriter, read_events, summarize, tail_log
from jobs.io.layout import JobLayout


def run(writer: EventWriter, first: int, last: int, resumed_at: int = 0, save_every: int = 2) -> None:
    writer.emit("start", max_steps=last, resumed_at=resumed_at)
    for step in range(first, last + 1):
        writer.emit("step", step=step, max_steps=last, loss=1.0 / step)
        if step % save_every == 0:
            writer.emit("checkpoint", step=step, path=f"checkpoints/step-{step}")


def test_a_resumed_run_supersedes_what_the_earlier_run_reported_after_its_checkpoint(tmp_path):
    writer = EventWriter(tmp_path)
    run(writer, 1, 5)  # killed after step 5; its last checkpoint is step 4
    writer.emit("error", kind="killed", message="cancelled by the user", step=5)
    run(writer, 5, 8, resumed_at=4)
    writer.emit("done", step=8)
    summary = summarize(tmp_path)
    assert [e["step"] for e in summary.steps] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [e["step"] for e in summary.checkpoints] == [2, 4, 6, 8]
    assert summary.start["resumed_at"] == 4 and summary.final["type"] == "done"
    assert summary.progress == 1.0
    assert len([e for e in read_events(tmp_path) if e["type"] == "step"]) == 9  # the file keeps both runs (5 + 4)


def test_a_fresh_start_in_the_same_folder_starts_the_summary_over(tmp_path):
    writer = EventWriter(tmp_path)
    run(writer, 1, 3)
    writer.emit("error", kind="io", message="disk full", step=3)
    writer.emit("start", max_steps=2, resumed_at=0)
    summary = summarize(tmp_path)
    assert summary.steps == [] and summary.final is None and summary.start["max_steps"] == 2


def test_damaged_files_read_as_what_can_be_read(tmp_path):
    events = JobLayout(tmp_path).events
    events.write_bytes(b'{"type": "start", "max_steps": "x"}\n\xff\xfe\n[1]\n{"type": "step"}\n'
                       b'{"type": "step", "step": 1, "max_steps": "?"}\n{"type": "done", "st')
    summary = summarize(tmp_path)
    assert [e["step"] for e in summary.steps] == [1] and summary.final is None
    assert summary.progress == 0.0
    events.unlink()
    events.mkdir()  # not a file at all
    assert read_events(tmp_path) == [] and summarize(tmp_path).start is None
    assert tail_log(tmp_path / "missing") == ""


def test_the_writer_checks_types_and_kinds_and_writes_private_files(tmp_path):
    writer = EventWriter(tmp_path / "job")
    assert "io" in ERROR_KINDS
    writer.emit("error", kind="io", message="cannot write x: No space left on device", step=0)
    with pytest.raises(ValueError):
        writer.emit("error", kind="disk", message="?")
    with pytest.raises(ValueError):
        writer.emit("progress")
    assert writer.path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "job").stat().st_mode & 0o777 == 0o700


def test_the_tail_reads_only_appended_lines_and_matches_the_whole_file(tmp_path, monkeypatch):
    import json as json_module

    from jobs.io import events as events_module
    from jobs.io.events import EventTail, summarize
    writer, tail = EventWriter(tmp_path), EventTail(tmp_path)
    assert tail.read().steps == []
    writer.emit("start", resumed_at=0)
    for n in range(1, 6):
        writer.emit("step", step=n, loss=1.0 / n)
    first = tail.read()
    assert [e["step"] for e in first.steps] == [1, 2, 3, 4, 5]
    parsed, real_loads = [], json_module.loads
    monkeypatch.setattr(events_module.json, "loads", lambda text: parsed.append(text) or real_loads(text))
    writer.emit("step", step=6, loss=0.1)
    with open(writer.path, "a") as fh:
        fh.write('{"type": "step", "st')          # a line being written: waits for its end
    second = tail.read()
    assert len(parsed) == 1 and [e["step"] for e in second.steps][-1] == 6
    assert [e["step"] for e in first.steps] == [1, 2, 3, 4, 5]   # a summary handed out never changes
    with open(writer.path, "a") as fh:
        fh.write('ep": 7, "loss": 0.05}\n')
    writer.emit("start", resumed_at=3)                  # a resumed run supersedes steps after 3
    monkeypatch.undo()
    assert [e["step"] for e in tail.read().steps] == [e["step"] for e in summarize(tmp_path).steps] == [1, 2, 3]
    writer.path.unlink()                                 # replaced by a new, shorter file: read anew
    writer.emit("step", step=1, loss=2.0)
    assert [e["loss"] for e in tail.read().steps] == [2.0]
