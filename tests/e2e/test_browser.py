"""The studio in a real browser: `python app.py` as a subprocess, Debian's chromium driven by
Playwright. Train the tiny model from the form, watch the job finish on the Jobs tab, download the
adapter zip, chat with base and tuned (streamed), and close / reopen the page mid-job.

Everything is checked through the page (never the filesystem) except the downloaded zip.
Set FUSETUNE_SCREENSHOT=path to also write the docs screenshot (Train tab + Jobs tab)."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.e2e.browser import CHROMIUM, chromium_context, combine_screenshots
from tests.tiny import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = os.environ.get("FUSETUNE_SCREENSHOT")

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_app(root: Path, *extra: str):
    """`python app.py` on a free port with a fresh data dir under root; yields (url, log path)."""
    port, log_path = free_port(), root / "app.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--data-dir", str(root / "data"),
                                 *extra], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"the app did not come up:\n{log_path.read_text(errors='replace')[-3000:]}")
                time.sleep(0.5)
        yield url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """(url, tiny model dir, log path): the real app on a fresh data dir."""
    root = tmp_path_factory.mktemp("e2e")
    model_dir = make_tiny_model(root / "tiny")
    with running_app(root) as (url, log_path):
        yield url, model_dir, log_path


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return tmp_path_factory.mktemp("shots")


@pytest.fixture(scope="module")
def browser_context():
    with chromium_context() as context:
        yield context


def open_studio(context, url):
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#ft-start", timeout=60_000)
    return page


def set_text(page, elem_id: str, value: str) -> None:
    """Type into a Textbox / Number / custom-value Dropdown and commit it like a user."""
    box = page.locator(f"#{elem_id} input, #{elem_id} textarea").first
    box.click()
    box.fill(value)
    if elem_id in ("ft-field-model", "ft-field-dataset"):
        box.press("Enter")  # a dropdown takes a custom value on Enter
    box.press("Tab")


def pick_option(page, elem_id: str, text: str, timeout_s: float = 30) -> None:
    """Open a dropdown and click the option containing `text`; the choices arrive from the server
    after a tab switch, so reopen it until they are there."""
    deadline = time.time() + timeout_s
    while True:
        page.locator(f"#{elem_id} input").click()
        option = page.locator("ul[role=listbox] li", has_text=text).first
        try:
            option.wait_for(timeout=2_000)
            option.click()
            return
        except PlaywrightTimeout:
            if time.time() > deadline:
                raise
            page.keyboard.press("Escape")
            page.locator("#ft-header").click()


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


def fill_job_form(page, model_dir: Path, max_steps: int) -> None:
    set_text(page, "ft-field-model", str(model_dir))
    set_text(page, "ft-field-max_steps", str(max_steps))
    page.wait_for_function(
        "([m, s]) => { const t = document.querySelector('#ft-command').innerText;"
        " return t.includes('model: ' + m) && t.includes('max_steps: ' + s); }",
        arg=[str(model_dir), str(max_steps)], timeout=15_000)


STREAM_WATCH = """() => {
  window.__ftLens = {tuned: [], base: []};
  for (const side of ['tuned', 'base']) {
    const root = document.querySelector('#ft-chat-' + side);
    new MutationObserver(() => {
      const bots = root.querySelectorAll('[data-testid="bot"]');
      const text = bots.length ? bots[bots.length - 1].innerText : '';
      const seen = window.__ftLens[side];
      if (seen[seen.length - 1] !== text) seen.push(text);
    }).observe(root, {subtree: true, childList: true, characterData: true});
  }
}"""


def check_streamed(texts: list[str], side: str) -> None:
    grown = [t for t in texts if t and "loading the model" not in t]
    assert len(set(grown)) >= 2, f"{side}: no streaming seen, only {texts!r}"
    assert len(grown[-1]) > len(grown[0]), f"{side}: the reply did not grow: {grown!r}"


def test_train_export_chat(studio, browser_context, shots, tmp_path):
    url, model_dir, log_path = studio
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, 30)

    set_text(page, "ft-field-learning_rate", "7")  # refused by name, nothing starts
    page.wait_for_function("() => document.querySelector('#ft-command').innerText.includes('above the maximum')",
                           timeout=15_000)
    page.locator("#ft-start").click()
    page.wait_for_function("() => document.querySelector('#ft-train-status').innerText"
                           ".includes('Learning rate (learning_rate)')", timeout=15_000)
    assert selected_tab(page) == "Train"
    set_text(page, "ft-field-learning_rate", "0.0002")
    page.wait_for_function("() => document.querySelector('#ft-command').innerText.includes('learning_rate: 0.0002')",
                           timeout=15_000)

    page.locator("#ft-preview-btn").click()
    page.wait_for_selector("#ft-preview-rows .ft-answer", timeout=60_000)
    preview = page.locator("#ft-preview-rows").inner_text()
    assert "<|im_start|>assistant" in preview and "Fusetune" in preview
    if SCREENSHOT:
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(shots / "train.png"), full_page=True)

    page.locator("#ft-start").click()
    page.wait_for_function("() => document.querySelector('#ft-tabs [role=tab][aria-selected=true]')"
                           "?.innerText.trim() === 'Jobs'", timeout=15_000)
    state, step = wait_for_state(page, ("done", "failed", "cancelled"), 180)
    assert (state, step) == ("done", 30), page.locator("#ft-job-failure").inner_text()
    assert page.locator("#ft-jobs-table").inner_text().count("done") == 1
    assert page.locator("#ft-loss-plot canvas, #ft-loss-plot svg").count() > 0
    job_label = page.locator("#ft-job-select input").input_value()
    job_id = job_label.split(" · ")[0]

    page.get_by_role("tab", name="Export").click()
    pick_option(page, "ft-export-select", job_id)
    page.wait_for_selector("#ft-export-download:not([disabled])", timeout=30_000)
    with page.expect_download(timeout=30_000) as download:
        page.locator("#ft-export-download").click()
    archive = tmp_path / "adapter.zip"
    download.value.save_as(archive)
    names = {Path(n).name for n in zipfile.ZipFile(archive).namelist()}
    assert {"adapter_model.safetensors", "adapter_config.json"} <= names
    assert "LoRA adapter trained with Fusetune" in page.locator("#ft-model-card").inner_text()

    page.get_by_role("tab", name="Chat").click()
    pick_option(page, "ft-chat-adapter", job_id)
    page.wait_for_function("(m) => document.querySelector('#ft-chat-model input').value === m",
                           arg=str(model_dir), timeout=10_000)
    page.evaluate(STREAM_WATCH)
    page.locator("#ft-chat-input textarea").fill("Who are you?")
    page.locator("#ft-chat-send").click()
    page.wait_for_function("() => { const b = document.querySelectorAll('#ft-chat-base [data-testid=\"bot\"]');"
                           " return b.length && b[b.length-1].innerText.trim().length > 0"
                           " && !b[b.length-1].innerText.includes('loading the model'); }", timeout=120_000)
    page.wait_for_timeout(3000)  # let the base answer finish streaming
    lens = page.evaluate("() => window.__ftLens")
    check_streamed(lens["tuned"], "tuned")
    check_streamed(lens["base"], "base")
    assert "Generation failed" not in page.locator("#ft-chat-tuned").inner_text()
    page.close()


def upload_dataset(page, path: Path, stored_prefix: str) -> str:
    """Upload through the Upload button; returns the dataset path the form now holds."""
    with page.expect_file_chooser() as chooser:
        page.locator("#ft-upload").click()
    chooser.value.set_files(str(path))
    page.wait_for_function("(n) => document.querySelector('#ft-field-dataset input').value.includes(n)",
                           arg=stored_prefix, timeout=30_000)
    return page.locator("#ft-field-dataset input").input_value()


def test_job_outlives_the_page(studio, browser_context, shots, tmp_path):
    url, model_dir, _ = studio
    rows = tmp_path / "my rows.jsonl"
    rows.write_text("".join(
        f'{{"instruction": "Say the magic word <{i}>", "input": "", "output": "Abracadabra number {i}."}}\n'
        for i in range(24)))
    page = open_studio(browser_context, url)
    stored = upload_dataset(page, rows, "/datasets/my_rows-")
    assert "/datasets/my_rows-" in stored and stored.endswith(".jsonl")
    page.wait_for_selector("#ft-field-bot_name", state="hidden", timeout=10_000)  # builtin:identity only
    fill_job_form(page, model_dir, 5000)
    page.locator("#ft-preview-btn").click()
    page.wait_for_selector("#ft-preview-rows .ft-answer", timeout=60_000)
    assert "Abracadabra number 0." in page.locator("#ft-preview-rows .ft-answer").first.inner_text()
    assert "Say the magic word <0>" in page.locator("#ft-preview-rows .ft-prompt").first.inner_text()
    page.locator("#ft-start").click()
    _, first_step = wait_for_state(page, ("running",), 120, min_step=3)
    page.close()
    time.sleep(4)

    page = open_studio(browser_context, url)  # a new page: nothing but the server's disk state
    page.get_by_role("tab", name="Jobs").click()
    state, later_step = wait_for_state(page, ("running",), 60, min_step=first_step + 1)
    assert later_step > first_step
    assert "running" in page.locator("#ft-jobs-table").inner_text()
    if SCREENSHOT:
        page.wait_for_timeout(3000)  # a few more points on the curves
        page.screenshot(path=str(shots / "jobs.png"), full_page=True)
        combine_screenshots(shots / "train.png", shots / "jobs.png", Path(SCREENSHOT))

    job_id = page.locator("#ft-job-select input").input_value().split(" · ")[0]
    page.locator("#ft-cancel").click()
    state, _ = wait_for_state(page, ("cancelled",), 90)
    assert "cancel" in page.locator("#ft-job-failure").inner_text().lower()
    page.get_by_role("tab", name="Export").click()  # cancelling saved the adapter of its last step
    pick_option(page, "ft-export-select", job_id)
    page.wait_for_selector("#ft-export-download:not([disabled])", timeout=30_000)
    page.close()


def test_auth_guards_the_studio(browser_context, tmp_path):
    with running_app(tmp_path, "--auth", "tester:s3cret-pass") as (url, _):
        page = browser_context.new_page()
        page.goto(url)
        page.wait_for_selector("input[type=password]", timeout=60_000)
        assert page.locator("#ft-start").count() == 0

        def login(password: str) -> None:
            page.locator("input[type=text]").first.fill("tester")
            page.locator("input[type=password]").fill(password)
            page.get_by_role("button", name="Login").click()

        login("wrong")
        page.wait_for_timeout(2000)
        assert page.locator("#ft-start").count() == 0
        page.goto(url)
        page.wait_for_selector("input[type=password]", timeout=30_000)
        login("s3cret-pass")
        page.wait_for_selector("#ft-start", timeout=60_000)
        page.close()
