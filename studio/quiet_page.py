"""What an open page and the studio cost while nothing runs (issue 40 item 6: <= 5 % of a core in the
browser, <= 2 % in the studio; bench/idle_page.py measures both).

Two costs came from Gradio itself (6.31), not from the studio's own polling:

- The browser: Gradio's StatusTracker (js/statustracker/static/index.svelte) advances its elapsed-time
  counter on every animation frame while its event is pending, and only a status change stops it. A
  tracker unmounted while pending never gets one: the page's own "Loading..." tracker always is
  (removed once the app has loaded), and so is an output hidden by the event it waits for. Each such
  loop asks chromium for a frame 60 times a second for as long as the page is open: 5-9 % of a core
  in headless chromium on an idle Jobs tab. `FRAME_THROTTLE_JS`, put first in the page's <head> (the
  tracker takes its `requestAnimationFrame` when its module loads, before any `head=` script Gradio
  itself inserts could wrap it), runs the trackers' frame callbacks from a timer instead: 10 times a
  second while a progress display is on screen (its counter shows tenths), once a second when none is.
  A loop that was left behind then costs a timer tick a second and no frame; every other caller of
  requestAnimationFrame (vega's charts, transitions) is untouched.
- The studio: Gradio's queue looks for new events every 1 ms and for progress every 10 ms while it is
  free (gradio/queueing.py, `sleep_when_free`; 50 and 100 ms on Windows), 6-8 % of a core on an idle
  studio. `calm_queue` sets them to Gradio's own Windows values: an event waits at most 50 ms longer
  to start, where a poll already takes a round trip of more.
"""
from __future__ import annotations

from typing import Any

from starlette.middleware import Middleware

PAGE = "/"
QUEUE_IDLE_SLEEP_S = 0.05      # gradio/queueing.py's Windows value of sleep_when_free
PROGRESS_IDLE_SLEEP_S = 0.1    # and of progress_update_sleep_when_free

FRAME_THROTTLE_JS = """(() => {
  const frame = window.requestAnimationFrame.bind(window);
  const tracker = /statustracker-[\\w-]*\\.js/;
  const shownMs = 100, hiddenMs = 1000;
  window.__ftTrackerFrames = 0;
  window.requestAnimationFrame = function (callback) {
    if (!tracker.test(new Error().stack || "")) return frame(callback);
    window.__ftTrackerFrames += 1;
    const shown = document.querySelector('[data-testid="status-tracker"]:not(.hide)');
    return setTimeout(() => callback(performance.now()), shown ? shownMs : hiddenMs);
  };
})();"""
SCRIPT = b"<script data-ft-quiet>" + FRAME_THROTTLE_JS.encode() + b"</script>"


def calm_queue(demo: Any) -> Any:
    """`demo` (after `demo.queue()`) with its queue's idle checks at Gradio's Windows pace (module doc)."""
    queue = demo._queue   # made by Blocks.queue(); both attributes are read on each pass of its loops
    if not (hasattr(queue, "sleep_when_free") and hasattr(queue, "progress_update_sleep_when_free")):
        raise RuntimeError("gradio's Queue no longer has sleep_when_free: see studio/quiet_page.py")
    queue.sleep_when_free = QUEUE_IDLE_SLEEP_S
    queue.progress_update_sleep_when_free = PROGRESS_IDLE_SLEEP_S
    return demo


def middleware() -> Middleware:
    return Middleware(QuietPage)


def with_script(html: bytes) -> bytes:
    """The page with FRAME_THROTTLE_JS as the first thing in its <head> (before Gradio's modules)."""
    at = html.find(b"<head>")
    return html if at < 0 else html[:at + 6] + SCRIPT + html[at + 6:]


class QuietPage:
    """ASGI middleware: the page (GET /) goes out with FRAME_THROTTLE_JS in its <head>."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET" or not _is_page(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        plain = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept-encoding"]
        await self.app({**scope, "headers": plain}, receive, _adding_script(send))


def _is_page(path: str) -> bool:
    return "/" + path.strip("/") == PAGE


def _adding_script(send):
    """A `send` that holds an HTML answer back until its end and adds the script to it."""
    held: dict = {}
    chunks: list[bytes] = []

    async def send_page(message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = dict((k.lower(), v) for k, v in message.get("headers", []))
            if b"text/html" in headers.get(b"content-type", b"") and b"content-encoding" not in headers:
                held.update(message)
                return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = with_script(b"".join(chunks))
        headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
        await send({**held, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return send_page
