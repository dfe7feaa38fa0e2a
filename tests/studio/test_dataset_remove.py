"""Uploads: the same file uploaded twice is one entry; an upload can be removed (not a built-in
dataset, not a file outside datasets/, not one a queued or running job reads)."""
from types import SimpleNamespace

import pytest

from jobs.queue.store import JobState
from jobs.spec import BUILTIN_DATASETS, SpecError
from studio import form
from studio.dataset_remove import remove_upload, uploaded_file
from studio.train_tab import known_datasets, store_upload


def gradio_temp(tmp_path, name, text):
    path = tmp_path / "gradio-tmp" / f"{len(list(tmp_path.glob('gradio-tmp/*')))}" / name
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


class Jobs:
    """runner.store.list(states=...) with some jobs queued or running."""

    def __init__(self, *specs):
        self.store = self
        self.records = [SimpleNamespace(id=f"job{i}", spec=spec) for i, spec in enumerate(specs)]

    def list(self, states=()):
        assert set(states) == {JobState.QUEUED, JobState.RUNNING}
        return self.records


def test_the_same_file_uploaded_twice_is_listed_once(tmp_path):
    data = tmp_path / "data"
    first = store_upload(data, str(gradio_temp(tmp_path, "rows.jsonl", '{"text": "a"}\n')))
    again_source = gradio_temp(tmp_path, "copy of rows.jsonl", '{"text": "a"}\n')
    again = store_upload(data, str(again_source))
    assert again == first and not again_source.exists()  # nothing left in Gradio's cache
    other = store_upload(data, str(gradio_temp(tmp_path, "rows.jsonl", '{"text": "b"}\n')))
    assert other != first
    assert known_datasets(data) == [*BUILTIN_DATASETS, *sorted([str(first), str(other)])]


def test_an_upload_is_removed_and_nothing_else_is(tmp_path):
    data = tmp_path / "data"
    stored = store_upload(data, str(gradio_temp(tmp_path, "broken.json", "[{")))
    assert uploaded_file(data, str(stored)) == stored.resolve()
    for value in (BUILTIN_DATASETS[0], str(tmp_path / "elsewhere.json"), str(data / "datasets" / ".." / "x.json")):
        (tmp_path / "elsewhere.json").write_text("[]")
        with pytest.raises(SpecError) as info:
            remove_upload(data, Jobs(), value)
        assert info.value.key == "dataset" and "only uploads" in str(info.value)
    assert (tmp_path / "elsewhere.json").exists()

    with pytest.raises(SpecError) as info:
        remove_upload(data, Jobs({"dataset": str(stored)}), str(stored))
    assert "used by job job0" in str(info.value) and stored.exists()
    assert "任务 job0" in form.error_text(info.value, "zh-CN")

    assert remove_upload(data, Jobs({"dataset": "builtin:identity"}), str(stored)) == stored.resolve()
    assert not stored.exists() and known_datasets(data) == list(BUILTIN_DATASETS)


def test_an_unpacked_zip_is_removed_with_its_images(tmp_path):
    import zipfile
    data = tmp_path / "data"
    archive = tmp_path / "gradio-tmp" / "shapes.zip"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("rows.jsonl", '{"messages": []}\n')
        zf.writestr("imgs/1.png", b"not really a png")
    data_file = store_upload(data, str(archive))
    folder = data_file.parent
    assert folder.name.endswith(".unzipped") and str(data_file) in known_datasets(data)
    assert uploaded_file(data, str(data_file)) == data_file.resolve()
    remove_upload(data, Jobs(), str(data_file))
    assert not folder.exists() and str(data_file) not in known_datasets(data)
