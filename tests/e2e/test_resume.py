"""One job watched live, as a newcomer does: its training-loss line is drawn while it runs (not
only after re-entering the tab), Cancel's notice goes once the job is cancelled, and Resume
continues the same job: one row in the table, the same id, one curve going on past the step
where it stopped."""
from __future__ import annotations

import io
import time

from PIL import Image

from tests.e2e.studio_page import confirm, fill_job_form, notice, open_studio, progress, start_job, wait_for_state


def coloured_pixels(page, elem_id: str) -> int:
    """Pixels of the chart that are clearly coloured (a series line), not the grey axes, grid and text."""
    image = Image.open(io.BytesIO(page.locator(f"#{elem_id}").screenshot())).convert("RGB")
    return sum(1 for r, g, b in image.getdata() if max(r, g, b) - min(r, g, b) > 90)


def line_drawn(page, elem_id: str = "ft-loss-plot", timeout_s: float = 90) -> int:
    deadline = time.time() + timeout_s
    while True:
        count = coloured_pixels(page, elem_id)
        if count > 150 or time.time() > deadline:
            return count
        page.wait_for_timeout(1000)


def test_live_loss_curve_cancel_and_resume_as_one_job(studio, browser_context):
    url, model_dir, _ = studio
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, 3000, name="resume me")
    job = start_job(page)  # the Jobs tab opens on it; the chart mounts before any step exists
    wait_for_state(page, ("running",), 180, min_step=5)
    assert line_drawn(page) > 150, "the live training-loss line was not drawn"

    confirm(page, "cancel", job, "yes")
    notice(page, f"Cancelling job {job}")
    _, stopped = wait_for_state(page, ("cancelled",), 120)
    page.wait_for_function("() => !document.querySelector('#ft-job-action').innerText.includes('Cancelling')",
                           timeout=30_000)
    assert page.locator("#ft-resume").is_visible() and not page.locator("#ft-more").is_visible()

    question = confirm(page, "resume", job, "yes")
    assert "same job" in question
    notice(page, f"Job {job} continues from step")
    wait_for_state(page, ("running",), 180, min_step=stopped + 3)
    table = page.locator("#ft-jobs-table").inner_text()
    assert table.count(job) == 1 and table.count("resume me") == 1, table
    assert page.locator("#ft-job-select input").input_value().startswith(job)
    assert line_drawn(page) > 150
    state, step = progress(page)
    assert state == "running" and step > stopped
    page.close()
