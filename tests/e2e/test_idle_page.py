"""An open, idle page asks chromium for no frame loop (issue 40 item 6, studio/quiet_page.py): Gradio's
status trackers left pending when they were unmounted (the page's own "Loading..." one always is) used
to request an animation frame 60 times a second for as long as the page stayed open."""
from __future__ import annotations

from tests.e2e.studio_page import open_studio

WINDOW_MS = 3000


def test_an_idle_jobs_page_runs_no_frame_loop(studio, browser_context):
    url, _, _ = studio
    page = open_studio(browser_context, url)
    try:
        assert page.evaluate("() => typeof window.__ftTrackerFrames") == "number"   # the throttle is in
        page.get_by_role("tab", name="Jobs").click()
        page.wait_for_timeout(1000)
        before = page.evaluate("() => window.__ftTrackerFrames")
        page.wait_for_timeout(WINDOW_MS)
        frames = page.evaluate("() => window.__ftTrackerFrames") - before
        # a tracker left behind by Gradio asked for 60 frames a second (180 in the window), now 1; the
        # tab's first polls (every 1.5 s after a click) add one request per output while they wait
        assert frames < 60 * WINDOW_MS / 1000 / 2, frames
    finally:
        page.close()
