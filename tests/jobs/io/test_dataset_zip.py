"""An uploaded image-text .zip: unpacked with its images, or refused when it could escape or explode."""
import json

import pytest

from jobs.io.dataset_zip import ZipRefused, unpack_dataset_zip, unpacked_data_files
from tests.jobs.io.dataset_zips import make_zip, png_bytes


def test_the_data_file_and_its_images_are_unpacked_together(tmp_path):
    row = {"messages": [{"role": "user", "content": "<image>?"}, {"role": "assistant", "content": "red"}],
           "images": ["imgs/1.png"]}
    archive = make_zip(tmp_path / "my set.zip", {"set/train.jsonl": json.dumps(row).encode(),
                                                "set/imgs/1.png": png_bytes(), "__MACOSX/set/._1.png": b"x"})
    data = unpack_dataset_zip(archive, tmp_path / "datasets", max_bytes=10 ** 6)
    assert data.name == "train.jsonl" and (data.parent / "imgs" / "1.png").is_file()
    assert data.parents[1].name.startswith("my_set-") and data.parents[1].name.endswith(".unzipped")
    assert unpacked_data_files(tmp_path / "datasets") == [data]
    assert not list((tmp_path / "datasets").rglob("__MACOSX"))


@pytest.mark.parametrize("members, link, message", [
    ({"../evil.jsonl": b"{}"}, None, "points outside the archive's folder"),
    ({"/abs/evil.jsonl": b"{}"}, None, "points outside the archive's folder"),
    ({"a.jsonl": b"{}"}, "imgs/link.png", "is a symbolic link"),
    ({"a.jsonl": b"0" * 2000}, None, "unpacks to more than"),
    ({"imgs/1.png": b"x"}, None, "exactly one data file"),
    ({"a.jsonl": b"{}", "b.csv": b"x"}, None, "exactly one data file"),
])
def test_unsafe_or_unclear_archives_are_refused_and_leave_nothing(tmp_path, members, link, message):
    archive = make_zip(tmp_path / "bad.zip", members, link)
    with pytest.raises(ZipRefused, match=message):
        unpack_dataset_zip(archive, tmp_path / "datasets", max_bytes=1000)
    assert not (tmp_path / "datasets").exists() or not any((tmp_path / "datasets").iterdir())
    assert not (tmp_path / "evil.jsonl").exists()


def test_a_file_that_is_not_a_zip_is_refused(tmp_path):
    (tmp_path / "x.zip").write_text("hello")
    with pytest.raises(ZipRefused, match="is not a readable .zip file"):
        unpack_dataset_zip(tmp_path / "x.zip", tmp_path / "datasets", max_bytes=1000)

