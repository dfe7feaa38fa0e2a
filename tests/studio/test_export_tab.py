"""The Export tab: the newest finished job is pre-selected, the user's pick is kept, the model
card's front matter shows as metadata; exports run the export CLI, whose progress lines become
progress and whose result lines become sizes and downloads; the Chat tab then offers the exports."""
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs.export import model_card
from jobs.io.layout import JobLayout
from jobs.spec import JobSpec
from jobs.queue.store import JobRecord
from studio.chat_tab import is_export, model_choices
from studio.context import StudioContext
from studio.export_tab import (ExportOutcome, ExportTab, downloadable, model_card_text, outcome_html, run_export,
                               split_front_matter, start_export)
from tests.jobs.export_jobs import train_job
from tests.studio.fakes import ListRunner
from tests.tiny import make_tiny_model


@dataclass
class Record:
    id: str
    job_dir: str
    spec: dict
    name: str = "tiny · chat"
    state: str = "done"


class Runner:
    def __init__(self, records):
        self.records = {r.id: r for r in records}

    def get(self, job_id):
        return self.records.get(job_id)

    def list_jobs(self):
        return list(self.records.values())


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-tab")
    model = make_tiny_model(root / "tiny")
    job = train_job(root, model, "job1")
    empty = root / "empty-job"
    empty.mkdir()
    (empty / "config.yaml").write_text(f"model: {model}\n")
    runner = Runner([Record("job1", str(job), {"model": str(model)}), Record("bare", str(empty), {})])
    return StudioContext(data_dir=root / "data", runner=runner)


def script(*lines: str, code: int = 0) -> list[str]:
    body = "".join(f"print({line!r}, flush=True);" for line in lines)
    return [sys.executable, "-c", f"{body}import sys; sys.exit({code})"]


def test_progress_results_notes_and_errors_are_read_from_the_cli_output():
    seen = []
    outcome = run_export(script("[  0%] reading", "[ 42%] wrote blk.3", "some warning",
                                "note: QLoRA job: merged into the dequantized base",
                                "exported: /x/m (1) f16.gguf (1.2 GB)", "[100%] done"),
                         lambda f, m: seen.append((f, m)))
    assert seen == [(0.0, "reading"), (0.42, "wrote blk.3"), (1.0, "done")]
    assert outcome.files == [("/x/m (1) f16.gguf", "1.2 GB")] and outcome.error is None
    assert outcome.notes == ["QLoRA job: merged into the dequantized base"]
    failed = run_export(script("[  0%] reading", "fusetune: export error: the disk filled up", code=1), print)
    assert failed.error == "the disk filled up" and "Export failed: the disk filled up" in outcome_html("gguf", failed)
    crashed = run_export(script("Traceback: boom", code=3), print)
    assert crashed.error.startswith("the export stopped unexpectedly") and "boom" in crashed.error


def test_gguf_export_of_a_job_lists_files_with_sizes_and_offers_them(ctx):
    seen = []
    status, files = start_export(ctx, "job1", "gguf", "q8_0", lambda f, m: seen.append(f))
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)
    job_dir = Path(ctx.runner.get("job1").job_dir)
    gguf_file = job_dir / "exports" / "tiny-ft-q8_0" / "tiny-ft-q8_0.gguf"
    assert files == [str(gguf_file), str(gguf_file.parent / "Modelfile")]
    assert "Exported" in status and str(gguf_file) in status and " KB</b>" in status
    assert "ollama create my-model -f" in status


def test_merged_export_is_offered_as_a_zip_and_its_files_and_the_chat_tab_offers_both(ctx):
    status, files = start_export(ctx, "job1", "merged", "f16", lambda f, m: None)
    merged = Path(ctx.runner.get("job1").job_dir) / "exports" / "tiny-ft-merged"
    assert str(merged) in status and (merged / "config.json").is_file()
    assert files[0] == str(merged.with_suffix(".zip")) and str(merged / "config.json") in files
    with zipfile.ZipFile(files[0]) as bundle:
        names = set(bundle.namelist())
    assert "tiny-ft-merged/config.json" in names and any(n.endswith(".safetensors") for n in names)
    assert {Path(f).name for f in files[1:]} == {n.split("/", 1)[1] for n in names}
    choices = dict((value, label) for label, value in model_choices(ctx))
    assert choices[str(merged)] == "job1 · export: tiny-ft-merged"
    exported_gguf = [v for v in choices if v.endswith(".gguf")]
    assert exported_gguf and all(is_export(v) for v in [str(merged), *exported_gguf])
    assert not is_export(ctx.runner.get("job1").spec["model"])


def test_a_job_without_adapter_fails_with_the_reason(ctx):
    status, files = start_export(ctx, "bare", "merged", "f16", lambda f, m: None)
    assert files == [] and "Export failed" in status and "no finished adapter" in status
    assert "Pick a finished job" in start_export(ctx, None, "gguf", "f16", print)[0]


def test_downloadable_keeps_files_only(tmp_path):
    (tmp_path / "a.zip").write_bytes(b"z")
    (tmp_path / "a.gguf").write_bytes(b"g")
    (tmp_path / "Modelfile").write_text("FROM ./a.gguf\n")
    (tmp_path / "folder").mkdir()
    outcome = ExportOutcome(files=[(str(tmp_path / "a.zip"), "1 B"), (str(tmp_path / "a.gguf"), "1 B"),
                                   (str(tmp_path / "folder"), "0 B")])
    assert downloadable(outcome) == [str(tmp_path / "a.zip"), str(tmp_path / "a.gguf"), str(tmp_path / "Modelfile")]


def test_picking_a_job_offers_the_zip_and_estimates_every_export(ctx):
    from studio.export_tab import prepare
    download, status, card = prepare(ctx, "job1")
    assert download["interactive"] is True and download["value"].endswith("-adapter.zip")
    assert "Export sizes, about: merged:" in status and "gguf q8_0:" in status and "LoRA adapter" in card
    from jobs.export import estimate_sizes
    sizes = estimate_sizes(ctx.runner.get("job1").job_dir)
    assert sizes["gguf q8_0"] < sizes["gguf f16"] < sizes["merged"]  # the tiny model is stored in fp32



def test_a_full_disk_when_the_page_offers_the_zip_is_a_sentence_not_a_raw_errno(ctx, tmp_path, monkeypatch):
    """Issue 36 item 6: every page load offers the newest job's zip, which Gradio copied into its cache
    after the handler returned; on a full disk that ended as a raw "[Errno 28]" toast."""
    import errno
    from gradio import processing_utils
    from studio.export_tab import prepare
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "cache"))   # a cache without the zip yet

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as patched:
        patched.setattr(processing_utils.shutil, "copy2", full_disk)
        download, status, card = prepare(ctx, "job1")
        assert download["interactive"] is False and "ft-error" in status and "[Errno" not in status
        assert "job1-adapter.zip) cannot be offered for download: cannot write" in status
        assert "No space left on device" in status and "Free some space, then pick the job again." in status
        assert "无法提供下载" in prepare(ctx, "job1", "zh-CN")[1] and "LoRA adapter" in card
    download, _, _ = prepare(ctx, "job1")   # space again: the copy the button serves is made here
    assert download["interactive"] is True and download["value"].startswith(str(tmp_path / "cache"))


def finished(tmp_path, job_id, state="done", adapter=True):
    layout = JobLayout(tmp_path / job_id)
    if adapter:
        layout.adapter.mkdir(parents=True)
        (layout.adapter / "adapter_model.safetensors").write_bytes(b"")
        (layout.adapter / "adapter_config.json").write_text("{}")
    return JobRecord(id=job_id, name=job_id, state=state, created_at=0.0, job_dir=str(layout.root))


def test_newest_finished_job_is_preselected_and_a_pick_is_kept(tmp_path):
    records = [finished(tmp_path, "running", "running", adapter=False), finished(tmp_path, "newest"),
               finished(tmp_path, "failed", "failed", adapter=False), finished(tmp_path, "older")]
    ctx = StudioContext(data_dir=tmp_path, runner=ListRunner(records))
    tab = ExportTab(select=None, picked=None)
    update = tab.refresh(ctx, None, "en")
    assert update["value"] == "newest" and [v for _, v in update["choices"]] == ["newest", "older"]
    assert tab.refresh(ctx, "older", "en")["value"] == "older"
    assert tab.refresh(ctx, "deleted-meanwhile", "en")["value"] == "newest"
    assert "已完成" in tab.refresh(ctx, None, "zh-CN")["choices"][0][0]
    assert ExportTab(select=None, picked=None).refresh(StudioContext(data_dir=tmp_path, runner=ListRunner([])), None, "en")[
        "value"] is None


def test_front_matter_becomes_a_metadata_table(tmp_path):
    card = model_card(JobSpec(), "HuggingFaceTB/SmolLM2-135M-Instruct", 1.23, 60)
    meta, body = split_front_matter(card)
    assert meta["library_name"] == "peft" and meta["tags"] == ["fusetune", "lora"]
    assert body.startswith("# LoRA adapter trained with Fusetune Studio")
    record = finished(tmp_path, "a")
    JobLayout(record.job_dir).model_card.write_text(card)
    shown = model_card_text(record.job_dir)
    assert not shown.startswith("---") and "\n---\n#" not in shown
    assert "| `base_model` | HuggingFaceTB/SmolLM2-135M-Instruct |" in shown
    assert "| `tags` | fusetune, lora |" in shown and "| 键 | 值 |" in model_card_text(record.job_dir, "zh-CN")


def test_cards_without_front_matter_are_unchanged():
    assert split_front_matter("# Title\ntext") == ({}, "# Title\ntext")
    assert split_front_matter("---\n: : bad\n---\nbody")[0] == {}
    assert split_front_matter("---\nonly open") == ({}, "---\nonly open")


# An export that waits a minute inside its first tensor, mid-write (the CLI itself, slowed down).
SLOW_EXPORT = ("import sys, time\nimport jobs.export.to_gguf as g\nreal = g.encode\n"
               "def slow(*args):\n    time.sleep(60)\n    return real(*args)\n"
               "g.encode = slow\nfrom jobs.export.__main__ import main\nsys.exit(main(sys.argv[1:]))")


def _slow_export(job_dir) -> list[str]:
    return [sys.executable, "-c", SLOW_EXPORT, str(job_dir), "--format", "gguf", "--device", "cpu"]


def _wait_for_partial(job_dir: Path) -> Path:
    import time
    deadline = time.time() + 120
    while time.time() < deadline:
        found = list((job_dir / "exports").glob(".*.partial-*")) if (job_dir / "exports").is_dir() else []
        if found and any(found[0].iterdir()):
            return found[0]
        time.sleep(0.2)
    raise AssertionError("the export never started writing")


def test_cancel_stops_a_running_export_within_seconds_and_leaves_nothing(ctx, tmp_path):
    """Issue 36 item 5: Cancel on the page (ExportRuns.cancel with the page's key) stops the export
    CLI's process group while it writes; its temporary folder and the folders it made are gone."""
    import shutil
    import threading
    import time
    from studio.export_runs import GRACE_S, ExportRuns
    job = Path(shutil.copytree(ctx.runner.get("job1").job_dir, tmp_path / "job1"))
    shutil.rmtree(job / "exports", ignore_errors=True)   # the earlier tests' exports
    runs, done = ExportRuns(), {}
    worker = threading.Thread(target=lambda: done.update(outcome=run_export(
        _slow_export(job), lambda *_: None, runs, "page-1", str(job))))
    worker.start()
    _wait_for_partial(job)
    began = time.time()
    assert runs.cancel("page-1")
    worker.join(30)
    # within the grace time: SIGTERM unwound the CLI itself (a SIGKILL comes only after GRACE_S)
    assert time.time() - began < GRACE_S and not worker.is_alive()
    assert done["outcome"].error == "the export was cancelled; nothing of it was left behind"
    assert not (job / "exports").exists()
    assert not runs.cancel("page-1")   # nothing runs any more


def test_a_killed_export_leaves_nothing_after_the_studio_restarts(ctx, tmp_path):
    """SIGKILL half-way through a GGUF export leaves its `.partial-<pid>` folder; the studio's start
    (app.open_data_dir) removes it, and the exports/ folder the export had made."""
    import shutil
    import signal
    import subprocess
    import app
    from tests.conftest import ROOT
    data = tmp_path / "data"
    job = Path(shutil.copytree(ctx.runner.get("job1").job_dir, data / "jobs" / "job1"))
    shutil.rmtree(job / "exports", ignore_errors=True)   # the earlier tests' exports
    proc = subprocess.Popen(_slow_export(job), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = _wait_for_partial(job)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert partial.exists() and partial.name.endswith(f".partial-{proc.pid}")
    app.open_data_dir(str(data))
    assert not (job / "exports").exists()
    assert (job / "adapter").is_dir()   # the job itself is untouched
