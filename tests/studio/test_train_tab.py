"""Train tab logic: uploads, the live command box, Start's validation."""
from pathlib import Path

import pytest

from jobs.queue.runner import Runner
from jobs.spec import BUILTIN_DATASETS, JobSpec, SpecError
from studio import form
from studio.train_tab import command_text, known_datasets, safe_upload_name, store_upload, upload_notice
from tests.studio.fakes import RecordingRunner
from tests.studio.form_fill import form_values


def test_safe_upload_name():
    name = safe_upload_name("../../etc/my data (1).JSONL")
    assert "/" not in name and name.endswith(".jsonl") and name.startswith("my_data_1-")
    assert safe_upload_name("train.json") != safe_upload_name("train.json")
    assert safe_upload_name("???.csv").startswith("dataset-")


def test_store_upload_copies_into_data_dir(tmp_path):
    upload = tmp_path / "gradio-tmp" / "rows.parquet"
    upload.parent.mkdir()
    upload.write_bytes(b"PAR1")
    stored = store_upload(tmp_path / "data", str(upload))
    assert stored.parent == tmp_path / "data" / "datasets" and stored.read_bytes() == b"PAR1"
    assert known_datasets(tmp_path / "data") == [*BUILTIN_DATASETS, str(stored)]
    bad = tmp_path / "notes.txt"
    bad.write_text("x")
    with pytest.raises(SpecError) as info:
        store_upload(tmp_path / "data", str(bad))
    assert info.value.key == "dataset" and "notes.txt is not a .json" in str(info.value)
    assert "notes.txt 不是 .json" in form.error_text(info.value, "zh-CN")


def test_command_box_shows_yaml_and_command(tmp_path):
    runner = Runner(tmp_path)
    names, values = form_values(max_steps=33, lora_r=4)
    text = command_text(runner, tmp_path, names, values)
    assert "-m jobs.train" in text and "max_steps: 33" in text and "lora_r: 4" in text
    assert f"{tmp_path}/jobs/<job-id>/config.yaml" in text
    output_line = next(line for line in text.splitlines() if line.startswith("output_dir:"))
    assert f"{tmp_path}/jobs/<job-id>" in output_line
    names, values = form_values(learning_rate=5.0)
    text = command_text(runner, tmp_path, names, values)
    assert "learning_rate" in text and "above the maximum" in text and "jobs.train" not in text


def test_a_name_with_a_bidi_override_is_refused_on_the_page_with_the_reason():
    """Issue 36 item 6: U+202E in a name flipped the job dropdown's labels; it is refused, in both languages."""
    names, values = form_values(name="run\u202egpj.exe")
    text = command_text(Runner.__new__(Runner), Path("/d"), names, values)
    assert "control character U+202E at character 4" in text and "jobs.train" not in text
    text = command_text(Runner.__new__(Runner), Path("/d"), names, values, "zh-CN")
    assert "第 4 个字符处含有不可见的控制字符 U+202E" in text


def test_command_box_in_chinese_names_the_field():
    names, values = form_values(batch_size="abc")
    text = command_text(Runner.__new__(Runner), Path("/d"), names, values, "zh-CN")
    assert "修正以下问题后才能开始" in text and "批大小（batch_size）" in text and "abc" in text


def test_upload_notice_says_format_and_rows(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"instruction": "q{i}", "output": "a{i}"}}\n' for i in range(1234)))
    assert "rows.jsonl: alpaca format, 1,234 rows." in upload_notice(rows, "en")
    chats = tmp_path / "chats.json"
    chats.write_text('[{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]')
    assert "messages 格式，共 1 行" in upload_notice(chats, "zh-CN")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "q"}\nnot json\n')
    notice = upload_notice(broken, "en")
    assert "ft-error" in notice and "broken.jsonl" in notice and "line 2" in notice


def test_upload_notice_recognises_grpo_prompt_rows(tmp_path):
    """Issue 36 item 6: a valid prompt/answer upload was "cannot be read: cannot tell the format"."""
    prompts = tmp_path / "math.jsonl"
    prompts.write_text("".join(f'{{"prompt": "{i}+1?", "answer": "{i + 1}"}}\n' for i in range(12)))
    notice = upload_notice(prompts, "en")
    assert "math.jsonl: prompt rows (for grpo) format, 12 rows." in notice and "ft-error" not in notice
    questions = tmp_path / "q.csv"
    questions.write_text("question,answer\n2+2?,4\n")
    assert "提示数据（用于 grpo） 格式，共 1 行" in upload_notice(questions, "zh-CN")
    other = tmp_path / "other.jsonl"
    other.write_text('{"answer": "4"}\n')
    assert "cannot tell the format of row 1 (fields: answer)" in upload_notice(other, "en")


def test_upload_notice_reads_a_bounded_sample_of_a_big_file(tmp_path, monkeypatch):
    from jobs.data import dataset
    from studio import uploads
    monkeypatch.setattr(uploads, "UPLOAD_SAMPLE_ROWS", 50)
    big = tmp_path / "big.jsonl"
    big.write_text("".join(f'{{"instruction": "q{i}", "output": "a{i}"}}\n' for i in range(5000)) + "not json\n")
    seen = []
    real = dataset.scan_rows
    monkeypatch.setattr(dataset, "scan_rows", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    notice = upload_notice(big, "en")
    assert "alpaca format (from its first 50 rows), about 5,001 rows" in notice, notice
    assert len(seen[0][0]) == 51   # the sample, not the file (its bad last row is Start's to name)
    array = tmp_path / "big.json"
    array.write_text("[" + ",".join('{"text": "t"}' for _ in range(60)) + "]")
    assert "more than 50 rows" in upload_notice(array, "en")


class GpuRunner(RecordingRunner):
    def __init__(self, gpus):
        super().__init__()
        self.gpus = gpus

    def gpu_inventory(self):
        return self.gpus


def test_gpu_boxes_list_each_gpu_with_free_memory_and_write_the_gpus_key(tmp_path):
    from jobs.io.gpus import GpuInfo
    from studio.context import StudioContext
    from studio.train_tab import gpu_choices, gpus_value
    machine = [GpuInfo(0, "NVIDIA H200", 139.8, 140.4), GpuInfo(1, "NVIDIA H200", 12.25, 140.4, ("job-7",))]
    ctx = StudioContext(data_dir=tmp_path, runner=GpuRunner(machine))
    labels = gpu_choices(ctx)
    assert labels == [("GPU 0 · NVIDIA H200 · 139.8 of 140.4 GiB free", "0"),
                      ("GPU 1 · NVIDIA H200 · 12.2 of 140.4 GiB free · used by job-7", "1")]
    assert "可用 139.8 / 140.4 GiB" in gpu_choices(ctx, "zh-CN")[0][0]
    assert gpus_value(["1", "0"]) == "0,1" and gpus_value([]) == "auto" and gpus_value(None) == "auto"
    names, values = form_values(gpus=gpus_value(["1"]))
    assert JobSpec.from_dict(form.values_to_dict(names, values)).gpu_indices() == [1]
    assert gpu_choices(StudioContext(data_dir=tmp_path, runner=RecordingRunner())) == []


def test_gpu_labels_follow_a_language_switch(tmp_path):
    """The GPU boxes are filled per page load, so the language switch refills their labels too."""
    from jobs.io.gpus import GpuInfo
    from studio.app import build_studio
    from studio.context import StudioContext
    from jobs.queue.runner import Runner

    class OneGpuRunner(Runner):
        def gpu_inventory(self):
            return [GpuInfo(0, "NVIDIA H200", 139.8, 140.4)]
    runner = OneGpuRunner(tmp_path)
    ctx = StudioContext(data_dir=tmp_path, runner=runner)
    demo = build_studio(tmp_path, runner, ctx)
    boxes = next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "ft-gpus")
    on_switch = [fn for fn in demo.fns.values() if fn.outputs == [boxes] and fn.inputs == [ctx.lang]]
    assert len(on_switch) == 1
    update = on_switch[0].fn("zh-CN")
    assert update["choices"] == [("GPU 0 · NVIDIA H200 · 可用 139.8 / 140.4 GiB", "0")]


def test_upload_notice_refuses_a_deeply_nested_row_by_number(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_bytes(b'{"instruction": "q", "output": "a"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    notice = upload_notice(deep, "en")
    assert "ft-error" in notice and "row 2 (line 2) nests brackets" in notice and "nesting limit of 100" in notice
    assert "RecursionError" not in notice


def test_a_failed_upload_copy_leaves_nothing_behind(tmp_path, monkeypatch):
    import errno
    import shutil

    from jobs.io.storage import StorageError
    upload = tmp_path / "gradio-tmp" / "rows.jsonl"
    upload.parent.mkdir()
    upload.write_bytes(b'{"text": "hi"}\n' * 1000)

    def fill_disk(source, target):
        with open(target, "wb") as out:
            out.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "move", fill_disk)
    with pytest.raises(StorageError, match="No space left on device .* free on that disk"):
        store_upload(tmp_path / "data", str(upload))
    assert list((tmp_path / "data" / "datasets").iterdir()) == [] and not upload.exists()
    monkeypatch.undo()
    again = tmp_path / "gradio-tmp" / "again.jsonl"
    again.write_bytes(b'{"text": "hi"}\n')
    stored = store_upload(tmp_path / "data", str(again))
    assert stored.read_bytes() == b'{"text": "hi"}\n' and not again.exists()  # moved: one copy on the disk


def test_a_redraw_fired_before_the_newest_drawn_changes_nothing():
    """The browser sends each field's event on its own, so an older form can arrive last (a typed name
    shown as `name: ''`): the stamp taken when it fired keeps the newest form's drawing."""
    import gradio as gr

    from studio.newest_event import newest_only
    drawn = newest_only(lambda name: (f"name: {name}", "ok"), outputs=2)
    assert drawn(200.0, None, "B") == ("name: B", "ok", 200.0)
    assert drawn(100.0, 200.0, "") == (gr.skip(),) * 3            # fired before B's: skipped
    assert drawn(200.0, 200.0, "B") == ("name: B", "ok", 200.0)   # the same instant draws again
    assert drawn(None, 200.0, "C") == ("name: C", "ok", 200.0)     # unstamped (an API call) draws
