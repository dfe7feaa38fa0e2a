"""The Chat tab's Serve switch in a real browser: serve a finished job, see the URL, create an API key
(shown once), call /v1/models with it (401 without), then switch it off and find the port closed.

The finished job: one an earlier test of the session trained, else a 2-step job trained here."""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jobs.io.layout import JobLayout
from jobs.queue.store import JobState, JobStore
from jobs.spec import JobSpec
from tests.e2e.conftest import CancelOnlyRunner
from tests.e2e.studio_page import open_studio, pick_option, set_text


def finished_job(data_dir: Path, model_dir: Path) -> str:
    """A done job of the studio with an adapter: an earlier test's, else a 2-step one queued here
    through the store (no form, no preflight: the studio's own runner starts it)."""
    store = JobStore(data_dir / "jobs.sqlite")
    done = [r for r in store.list(states=(JobState.DONE,)) if JobLayout(r.job_dir).has_adapter()]
    if done:
        return done[-1].id
    job_id = CancelOnlyRunner(data_dir).submit(JobSpec(model=str(model_dir), max_steps=2, name="to serve")).id
    deadline = time.monotonic() + 300
    while (state := store.get(job_id).state) not in (JobState.DONE, JobState.FAILED, JobState.CANCELLED):
        assert time.monotonic() < deadline, f"job {job_id} still {state} after 300 s"
        time.sleep(1)
    assert state == JobState.DONE, f"job {job_id} ended {state}"
    return job_id


def get_models(url: str, key: str | None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/models", headers=headers), timeout=30) as answer:
        return json.load(answer)


def status_has(page, text: str, timeout_ms: int) -> str:
    page.wait_for_function("(w) => document.querySelector('#ft-serve-status').innerText.includes(w)",
                           arg=text, timeout=timeout_ms)
    return page.locator("#ft-serve-status").inner_text()


def test_serve_switch_key_and_models(studio, browser_context):
    url, model_dir, data_dir = studio
    job_id = finished_job(data_dir, model_dir)
    page = open_studio(browser_context, url)
    page.get_by_role("tab", name="Chat").click()
    page.locator("#ft-serve").get_by_text("Serve: an OpenAI-compatible API").click()
    pick_option(page, "ft-serve-jobs", job_id)
    set_text(page, "ft-serve-port", "0")

    page.locator("#ft-serve-on input").check()
    status = status_has(page, "The API answers at", 180_000)
    base = re.search(r"(http://127\.0\.0\.1:\d+/v1)", status).group(1)
    assert "curl" in status and "Authorization: Bearer" not in status   # no key yet: none needed

    set_text(page, "ft-key-name", "e2e client")
    page.locator("#ft-key-create").click()
    page.wait_for_function("() => (document.querySelector('#ft-key-new textarea, #ft-key-new input')?.value ?? '')"
                           ".startsWith('ft-')", timeout=30_000)
    key = page.locator("#ft-key-new textarea, #ft-key-new input").first.input_value()
    page.wait_for_function("() => document.querySelector('#ft-keys-table').innerText.includes('e2e client')",
                           timeout=30_000)
    assert key not in page.locator("#ft-keys-table").inner_text()
    status_has(page, "Authorization: Bearer $FUSETUNE_API_KEY", 10_000)   # the snippets now send a key

    with pytest.raises(urllib.error.HTTPError) as refused:
        get_models(base, None)   # a key exists now: the running server asks for one
    assert refused.value.code == 401
    folder = Path(JobStore(data_dir / "jobs.sqlite").get(job_id).job_dir).name   # a job's model id
    assert folder in [m["id"] for m in get_models(base, key)["data"]]

    page.locator("#ft-serve-on input").uncheck()
    status_has(page, "The API server is off", 60_000)
    with pytest.raises(urllib.error.URLError):
        get_models(base, key)
    page.close()
