"""Image-text data in the browser (issue 21): upload a .zip holding a JSONL and its images, see each
row's thumbnail beside its text in the preview (the image's tokens shown with their count), Start a
job on a tiny Qwen2.5-VL, see it finish, and chat with an image: base and tuned answer side by side
and both chats show the picture."""
from __future__ import annotations

import json
import zipfile

from jobs.data.builtin.shapes import shapes_rows
from tests.e2e.studio_page import fill_job_form, open_studio, pick_option, start_job, upload_dataset, wait_for_state
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
    job_id = start_job(page)
    state, step = wait_for_state(page, ("done",), timeout_s=400)
    assert step == 4
    chat_with_an_image(page, job_id, model_dir, tmp_path)
    page.screenshot(path=str(shots / "vision-chat.png"), full_page=True)
    page.close()


def chat_with_an_image(page, job_id: str, model_dir, tmp_path) -> None:
    from PIL import Image
    picture = tmp_path / "red.png"
    Image.new("RGB", (56, 56), (220, 30, 30)).save(picture)
    page.get_by_role("tab", name="Chat").click()
    pick_option(page, "ft-chat-adapter", job_id)
    page.wait_for_function("(m) => document.querySelector('#ft-chat-model input').value === m",
                           arg=str(model_dir), timeout=20_000)
    page.locator("#ft-chat-image input[type=file]").set_input_files(str(picture))
    page.wait_for_selector("#ft-chat-image img", timeout=30_000)
    page.wait_for_timeout(3000)   # a wait, not a check: let the upload land before Send
    page.locator("#ft-chat-input textarea").fill("How many red circles are in the picture?")
    page.locator("#ft-chat-send").click()
    for side in ("base", "tuned"):
        page.wait_for_function(
            "(s) => { const b = document.querySelectorAll('#ft-chat-' + s + ' [data-testid=\"bot\"]');"
            " return b.length && b[b.length-1].innerText.trim().length > 0"
            " && !b[b.length-1].innerText.includes('loading the model'); }", arg=side, timeout=180_000)
        page.wait_for_selector(f"#ft-chat-{side} img", timeout=30_000)   # the picture is in the chat
    page.wait_for_timeout(2000)
    for side in ("base", "tuned"):
        assert "Generation failed" not in page.locator(f"#ft-chat-{side}").inner_text()
