"""Driving the studio page like a user: the app as a subprocess, typing, picking, waiting for a
job's state. Shared by the browser tests (tests/e2e/test_*.py)."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from bench import page_check


@contextlib.contextmanager
def running_app(root: Path, *extra: str, seed=None):
    """`python app.py` on a free port with a fresh data dir under root (bench/page_check.py's start,
    the same on the GPU machine); yields (url, log path). With `seed` (the builtin_seed fixture) the
    data dir already holds the converted built-in model, so the studio's warm-up does not spend a
    CPU core converting it while the test's clicks wait."""
    log_path = root / "app.log"
    if seed is not None:
        seed.home(root / "data")
    started = page_check.running_app(root / "data", log_path, timeout_s=180, extra=list(extra))
    try:
        url = started.__enter__()
    except page_check.AppDidNotStart as error:
        pytest.fail(str(error))
    with contextlib.ExitStack() as stack:
        stack.push(started)
        yield url, log_path


def open_studio(context, url, ready_text: str = "Start"):
    """A new page on the studio, once its language has been applied (the start button's text)."""
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#ft-start", timeout=90_000)
    page.wait_for_function("(w) => document.querySelector('#ft-start').innerText.includes(w)",
                           arg=ready_text, timeout=60_000)
    # the load chain refills the model/dataset choices, which can undo a value typed before it ends
    page.wait_for_function("() => document.body.dataset.ftReady === '1'", timeout=90_000)
    return page


def set_text(page, elem_id: str, value: str) -> None:
    """Type into a Textbox / custom-value Dropdown and commit it like a user."""
    box = page.locator(f"#{elem_id} input, #{elem_id} textarea").first
    box.click()
    box.fill(value)
    if elem_id in ("ft-field-model", "ft-field-dataset"):
        box.press("Enter")  # a dropdown takes a custom value on Enter
    box.press("Tab")


def pick_option(page, elem_id: str, text: str, timeout_s: float = 60) -> None:
    """Open a dropdown and click the option containing `text`; the choices arrive from the server
    after a tab switch or a poll, so reopen it until they are there. Only this dropdown's own list
    counts: other dropdowns (on other tabs) may keep theirs in the page."""
    deadline = time.time() + timeout_s
    box = page.locator(f"#{elem_id} input")
    while True:
        box.click()
        options = page.locator(f"[id='{box.get_attribute('aria-controls')}'] li")
        option = options.filter(has_text=text).first
        try:
            option.wait_for(timeout=2_000)
            option.click()
            page.keyboard.press("Escape")
            # Escape closes the list but leaves the input focused, and a click on a focused input does
            # not open it again: the next pick's first try waited 2 s for nothing
            box.evaluate("element => element.blur()")
            return
        except PlaywrightTimeout:
            if time.time() > deadline:
                shown = options.all_inner_texts()
                raise AssertionError(f"no option {text!r} in #{elem_id} (typed {box.input_value()!r}, "
                                     f"shown {shown!r})") from None
            page.keyboard.press("Escape")
            page.locator("#ft-header").click()


def command_has(page, *parts: str, timeout_ms: int = 60_000) -> None:
    """Wait for the command box to show every part. It is redrawn after each field's change event,
    and those queue behind the fit estimate: on a busy 2-core machine that took over 20 s."""
    try:
        page.wait_for_function("(parts) => { const t = document.querySelector('#ft-command').innerText;"
                               " return parts.every((p) => t.includes(p)); }", arg=list(parts), timeout=timeout_ms)
    except Exception:
        shown = page.locator("#ft-command").inner_text()
        missing = [p for p in parts if p not in shown]
        raise AssertionError(f"the command box lacks {missing} after {timeout_ms / 1000:.0f} s; it shows:\n"
                             f"{shown[:3000]}") from None


def progress(page) -> tuple[str | None, int]:
    bar = page.locator("#ft-progress")
    if bar.count() == 0:
        return None, -1
    return bar.get_attribute("data-state"), int(bar.get_attribute("data-step") or 0)


def wait_for_state(page, states: tuple[str, ...], timeout_s: float, min_step: int = 0) -> tuple[str, int]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state, step = progress(page)
        if state in states and step >= min_step:
            return state, step
        page.wait_for_timeout(500)
    failure = page.locator("#ft-job-failure").inner_text()
    raise AssertionError(f"job stayed {progress(page)} (wanted {states}); failure box: {failure!r}; "
                         f"log: {page.locator('#ft-log').inner_text()[-1500:]}")


def selected_tab(page) -> str:
    return page.locator("#ft-tabs [role=tab][aria-selected=true]").inner_text().strip()


def fill_job_form(page, model_dir: Path, max_steps: int, name: str = "") -> None:
    set_text(page, "ft-field-model", str(model_dir))
    set_text(page, "ft-field-max_steps", str(max_steps))
    parts = [f"model: {model_dir}", f"max_steps: {max_steps}"]
    if name:
        set_text(page, "ft-field-name", name)
        parts.append(f"name: {name}")
    command_has(page, *parts)


def start_job(page) -> str:
    """Press Start; the page switches to the Jobs tab with the new job picked. Returns its id.

    Start runs the preflight first (the model's tokenizer and the whole dataset): on a loaded
    2-core CI machine that can take most of a minute the first time."""
    # the Jobs tab may not be rendered yet (then nothing is picked)
    before = page.evaluate("() => document.querySelector('#ft-job-select input')?.value ?? ''")
    page.locator("#ft-start").click()
    page.wait_for_function("() => document.querySelector('#ft-tabs [role=tab][aria-selected=true]')"
                           "?.dataset.tabId === 'jobs'", timeout=120_000)
    # a job picked earlier is still shown until the new one replaces it: wait for a different one
    page.wait_for_function("(before) => { const v = document.querySelector('#ft-job-select input')?.value ?? '';"
                           " return v.includes(' · ') && v !== before; }", arg=before, timeout=30_000)
    return picked_job(page)


def picked_job(page) -> str:
    return page.locator("#ft-job-select input").input_value().split(" · ")[0]


def pick_job(page, job_id: str) -> None:
    """Open a job from the list, as a user does, and wait for its details."""
    pick_option(page, "ft-job-select", job_id)
    page.wait_for_function("(id) => document.querySelector('#ft-job-select input').value.startsWith(id)",
                           arg=job_id, timeout=60_000)
    page.wait_for_selector("#ft-progress", timeout=90_000)


def upload_file(page, button_id: str, path: Path, shown_id: str, timeout_s: float = 90) -> None:
    """Choose `path` through the UploadButton `button_id`, as a user does (the file chooser it opens),
    and wait until `shown_id` shows the file's name."""
    with page.expect_file_chooser() as chooser:
        page.locator(f"#{button_id}").click()
    chooser.value.set_files(str(path))
    page.wait_for_function("([id, name]) => (document.querySelector('#' + id) || {innerText: ''})"
                           ".innerText.includes(name)", arg=[shown_id, path.name], timeout=timeout_s * 1000)


def upload_dataset(page, path: Path, stored_prefix: str) -> str:
    """Upload through the Upload button; returns the dataset path the form now holds."""
    with page.expect_file_chooser() as chooser:
        page.locator("#ft-upload").click()
    chooser.value.set_files(str(path))
    page.wait_for_function("(n) => document.querySelector('#ft-field-dataset input').value.includes(n)",
                           arg=stored_prefix, timeout=30_000)
    return page.locator("#ft-field-dataset input").input_value()


def switch_language(page, name: str, start_text: str) -> None:
    pick_option(page, "ft-lang", name)
    page.wait_for_function("(w) => document.querySelector('#ft-start').innerText.includes(w)",
                           arg=start_text, timeout=60_000)


# Every text the action notice shows from now on, in order: a "Cancelling job A" is true only until A
# has stopped, and on a loaded machine that can be sooner than a poll of the page looks.
WATCH_NOTICE_JS = """() => {
  const box = document.querySelector('#ft-job-action'), seen = window.__ftNoticesSeen = [box.innerText];
  if (window.__ftNoticeWatch) window.__ftNoticeWatch.disconnect();
  window.__ftNoticeWatch = new MutationObserver(() => {
    if (seen[seen.length - 1] !== box.innerText) seen.push(box.innerText);
  });
  window.__ftNoticeWatch.observe(box, {subtree: true, childList: true, characterData: true});
}"""


def confirm(page, button: str, job_id: str, answer: str) -> str:
    """Click an action; the question names the job; answer it. Returns the question."""
    page.locator(f"#ft-{button}").click()
    page.wait_for_selector("#ft-confirm-yes", state="visible", timeout=60_000)
    question = page.locator("#ft-confirm-text").inner_text()
    assert job_id in question, question
    page.evaluate(WATCH_NOTICE_JS)
    page.locator(f"#ft-confirm-{answer}").click()
    page.wait_for_selector("#ft-confirm-yes", state="hidden", timeout=60_000)
    return question


def notice(page, text: str) -> None:
    """The action notice showed `text` since the last answer (shown now, or shown and already gone)."""
    page.wait_for_function("(w) => (window.__ftNoticesSeen || []).some((t) => t.includes(w))"
                           " || document.querySelector('#ft-job-action').innerText.includes(w)",
                           arg=text, timeout=30_000)
