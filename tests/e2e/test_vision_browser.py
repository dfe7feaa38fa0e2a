"""Image-text data in the browser (issue 21): upload a .zip holding a JSONL and its images, see each
row's thumbnail beside its text in the preview (the image's tokens shown with their count), Start a
job on a tiny Qwen2.5-VL, and see it finish."""
from __future__ import annotations

import json
import zipfile

from jobs.data.builtin.shapes import shapes_rows
from tests.e2e.studio_page import fill_job_form, open_studio, start_job, wait_for_state
from tests.e2e.test_browser import upload_dataset
from tests.tiny import make_tiny_vision_model


def shapes_zip(tmp_path, rows: int = 6):
    folder = tmp_path / "shapes"
    lines = [json.dumps(row) for row in shapes_rows(folder, rows=rows, size=56)]
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    path = tmp_path / "my shapes.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for file in sorted(folder.rglob("*")):
            archive.write(file, file.relative_to(folder))
    return path


def test_zip_upload_shows_thumbnails_and_the_vision_job_trains(studio, browser_context, shots, tmp_path):
    url, _, data_dir = studio
    model_dir = make_tiny_vision_model(data_dir / "models" / "tiny-vl")   # the data dir's models/ is readable
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, 4, name="vision")
    stored = upload_dataset(page, shapes_zip(tmp_path), ".unzipped/train.jsonl")
    assert stored.startswith(str(data_dir / "datasets"))
    page.wait_for_selector("#ft-preview img.ft-thumb", timeout=120_000)
    assert page.locator("#ft-preview img.ft-thumb").count() == 3            # three rows, one image each
    width = page.locator("#ft-preview img.ft-thumb").first.evaluate("img => img.naturalWidth")
    assert width == 56                                                       # a real, decoded image
    text = page.locator("#ft-preview").inner_text()
    assert "<|image_pad|> x 4" in text and "How many" in text, text
    page.screenshot(path=str(shots / "vision-preview.png"), full_page=True)
    start_job(page)
    state, step = wait_for_state(page, ("done",), timeout_s=400)
    assert step == 4
    page.close()
