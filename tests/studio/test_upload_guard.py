"""Uploads are bounded and safe on a full disk (issue 23 item 3), through Gradio's real upload
route: over the limit or over the free space is refused before a byte is written, a write that
fails on a full disk leaves no temp file, and the messages follow the browser's language."""
import errno

import gradio as gr
import httpx
import pytest

from tests.asgi_call import run_coroutine

from jobs.io.storage import human_bytes
from studio.upload_guard import COPIES, SPARE_BYTES, UploadGuard

MB = 1024 ** 2


@pytest.fixture
def gradio_app(tmp_path, monkeypatch):
    """A function making Gradio's own app for a page with an upload button, the guard installed as
    app.py installs it (middleware inside Starlette's error handler)."""
    from gradio.routes import App
    from starlette.middleware import Middleware
    folder = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))

    def make(**guard):
        with gr.Blocks() as demo:
            gr.UploadButton()
        demo.max_file_size = None  # what launch() sets; the guard is what bounds the size here
        return App.create_app(demo, app_kwargs={"middleware": [Middleware(UploadGuard, upload_dir=folder, **guard)]})
    return make, folder


def _upload(guard, data: bytes, lang="en"):
    async def go():
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post("/gradio_api/upload", files={"files": ("rows.jsonl", data)},
                                   headers={"accept-language": lang})
    return run_coroutine(go)


def _left(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_an_upload_over_the_limit_is_refused_before_writing(gradio_app):
    make, folder = gradio_app
    guard = make(max_bytes=1 * MB, free=lambda _: 10 ** 12)
    refused = _upload(guard, b"x" * (2 * MB))
    assert refused.status_code == 413
    assert refused.text.startswith("The upload is 2.0 MB, over the upload limit of 1.0 MB: split the file, or start "
                                   "the studio with a larger --max-upload-mb. Nothing was saved.")
    assert _left(folder) == []
    assert "上传上限 1.0 MB" in _upload(guard, b"x" * (2 * MB), "zh-CN,zh;q=0.9").text
    ok = _upload(guard, b'{"text": "hi"}\n')
    assert ok.status_code == 200 and ok.json()[0].endswith("rows.jsonl")


def test_an_upload_the_disk_cannot_hold_is_refused_naming_the_free_space(gradio_app):
    make, folder = gradio_app
    size = 3 * MB
    guard = make(max_bytes=100 * MB, free=lambda _: COPIES * size + SPARE_BYTES - 1)
    refused = _upload(guard, b"x" * size)
    assert refused.status_code == 507 and "but the disk of the data dir" in refused.text
    # issue 36 item 6: the 64 MB it keeps free is said, so "needs" adds up against "free"
    need = COPIES * int(refused.request.headers["content-length"]) + SPARE_BYTES
    assert f"{human_bytes(need)}: the upload, its copy into datasets/, and 64.0 MB kept free" in refused.text
    assert refused.text.endswith("Free some space, then upload again. Nothing was saved.")
    assert "保留的 64.0 MB" in _upload(guard, b"x" * size, "zh-CN").text
    assert _left(folder) == []


def test_a_write_that_fails_on_a_full_disk_leaves_no_temp_file(gradio_app, monkeypatch):
    """The free space looked enough, then the disk filled while Gradio wrote its temp file."""
    from gradio import route_utils
    make, folder = gradio_app
    real_write = route_utils.GradioUploadFile.write
    written = []

    async def write_then_fill(self, data):
        await real_write(self, data)
        written.append(self.file.name)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(route_utils.GradioUploadFile, "write", write_then_fill)
    guard = make(max_bytes=100 * MB, free=lambda _: 10 ** 12)
    answer = _upload(guard, b"x" * MB)
    assert written and answer.status_code == 507
    assert answer.text.startswith("The upload could not be written: cannot write ")
    assert "No space left on device" in answer.text and answer.text.endswith("Nothing of it was kept.")
    assert _left(folder) == []


def test_a_body_without_content_length_is_cut_off_at_the_limit(gradio_app):
    make, folder = gradio_app
    guard = make(max_bytes=1 * MB, free=lambda _: 10 ** 12)
    boundary = b"fusetuneboundary"

    async def body():
        yield b"--" + boundary + b'\r\nContent-Disposition: form-data; name="files"; filename="a.jsonl"\r\n\r\n'
        for _ in range(80):  # 80 MB, more than the limit plus the spare
            yield b"x" * MB
        yield b"\r\n--" + boundary + b"--\r\n"

    async def go():
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post("/gradio_api/upload", content=body(),
                                   headers={"content-type": f"multipart/form-data; boundary={boundary.decode()}"})
    answer = run_coroutine(go)
    assert answer.status_code == 413 and "over the upload limit of 1.0 MB" in answer.text
    assert _left(folder) == []
