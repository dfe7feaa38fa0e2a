"""Uploads are bounded and safe on a full disk: ASGI middleware in front of Gradio's upload route.

Gradio streams an upload into a temporary file under GRADIO_TEMP_DIR (inside the data dir) and
only checks `max_file_size` as the bytes arrive; a full disk ends the request with an OSError
that leaves the partial temp file behind, and the disk at 0 bytes then breaks SQLite and every
page. So before a byte is read, the request's Content-Length is checked against the limit
(`--max-upload-mb`) and against the free space of that disk (the upload, plus its copy into
datasets/, plus a margin for the job database); a write that fails anyway removes the temp files
this request created and answers with the full-disk message. Messages follow the browser's
language (Accept-Language), through studio/i18n.py."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from jobs.io.storage import describe, free_bytes, human_bytes, is_disk_error
from studio.i18n import normalize, t

SPARE_BYTES = 64 * 1024 ** 2  # kept free for the job database, logs and the page's own writes
COPIES = 2                    # Gradio's temp file, then the copy in <data dir>/datasets/


class _TooLarge(Exception):
    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


def _header(scope: dict, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _is_upload(scope: dict) -> bool:
    path = scope.get("path", "").rstrip("/")
    return scope["type"] == "http" and scope.get("method") == "POST" and path.endswith("/upload")


async def _answer(send: Callable, status: int, text: str) -> None:
    body = text.encode("utf-8")
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class UploadGuard:
    def __init__(self, app: Any, upload_dir: str | os.PathLike, max_bytes: int, free=free_bytes):
        self.app, self.upload_dir, self.max_bytes, self.free = app, Path(upload_dir), max_bytes, free

    def refusal(self, size: int, lang: str) -> tuple[int, str] | None:
        """(HTTP status, message) when an upload of `size` bytes must not start, else None."""
        if size > self.max_bytes:
            return 413, t("upload.too_large", lang, size=human_bytes(size), limit=human_bytes(self.max_bytes))
        free, need = self.free(self.upload_dir), COPIES * size + SPARE_BYTES
        if free is not None and free < need:   # the message says what it keeps back, so the numbers add up
            return 507, t("upload.no_space", lang, size=human_bytes(size), free=human_bytes(free),
                          folder=str(self.upload_dir), need=human_bytes(need), reserve=human_bytes(SPARE_BYTES))
        return None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if not _is_upload(scope):
            await self.app(scope, receive, send)
            return
        lang = normalize(_header(scope, b"accept-language").split(",")[0])
        length = _header(scope, b"content-length")
        refused = self.refusal(int(length), lang) if length.isdigit() else None
        if refused:
            await _answer(send, *refused)
            return
        before, started, received = self._temp_files(), [], [0]

        async def tracking_send(message: dict) -> None:
            started.append(True)
            await send(message)

        async def counting_receive() -> dict:  # a body sent without Content-Length is bounded too
            message = await receive()
            received[0] += len(message.get("body", b""))
            if received[0] > self.max_bytes + SPARE_BYTES:
                raise _TooLarge(received[0])
            return message

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge as exc:
            self._remove_new(before)
            if not started:
                await _answer(send, 413, self.refusal(exc.size, lang)[1])
        except Exception as exc:
            if not is_disk_error(exc):
                raise
            self._remove_new(before)
            if not started:
                await _answer(send, 507, t("upload.disk_failed", lang, error=describe(self.upload_dir, exc)))

    def _temp_files(self) -> set[str]:
        try:
            return {entry.name for entry in os.scandir(self.upload_dir) if entry.is_file()}
        except OSError:
            return set()

    def _remove_new(self, before: set[str]) -> None:
        """Delete the temp files that appeared during this failed request (Gradio's NamedTemporaryFile
        names them tmp*; a finished upload is moved into a hash folder, so those are never touched)."""
        for name in self._temp_files() - before:
            if name.startswith("tmp"):
                try:
                    (self.upload_dir / name).unlink()
                except OSError:
                    pass
