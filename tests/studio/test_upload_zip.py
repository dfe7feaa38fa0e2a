"""The Train tab's upload of an image-text .zip (studio/uploads.py -> jobs/io/dataset_zip.py)."""
import pytest

from tests.jobs.io.dataset_zips import make_zip, png_bytes


def test_the_studio_upload_unpacks_a_zip_and_lists_its_data_file(tmp_path):
    from studio.uploads import known_datasets, store_upload
    upload = make_zip(tmp_path / "shapes.zip", {"d.jsonl": b"{}\n", "imgs/1.png": png_bytes()})
    stored = store_upload(tmp_path / "data", str(upload))
    assert stored.name == "d.jsonl" and (stored.parent / "imgs" / "1.png").is_file()
    assert str(stored) in known_datasets(tmp_path / "data") and not upload.exists()
    bad = make_zip(tmp_path / "bad.zip", {"../x.jsonl": b"{}"})
    with pytest.raises(ValueError) as info:
        store_upload(tmp_path / "data", str(bad))
    assert info.value.key == "dataset" and "bad.zip was not unpacked: ../x.jsonl points outside" in str(info.value)
