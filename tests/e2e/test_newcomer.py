"""What a newcomer trips on (issue 24), in a real browser.

Before any job: the fit check on this CPU says about how many minutes the job takes; the identity
preview says how many rows it trains on; an upload's note goes when another dataset is picked; the
same file uploaded twice is one entry, and an upload can be removed after saying yes.
One short job on a fresh model: its phases before the first step show in the Jobs tab; a click on
the jobs table opens no editor; Chat has the finished adapter picked; in 简体中文 the kernel report
and the fit check are Chinese; a merged export can be downloaded as a zip."""
from __future__ import annotations

import zipfile

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from jobs.io.events import read_events
from tests.e2e.studio_page import (command_has, fill_job_form, open_studio, pick_option, set_text, start_job,
                                   switch_language, upload_dataset, wait_for_state)
from tests.tiny import make_tiny_model

PHASE_WATCH = """() => {
  window.__ftPhases = [];
  const seen = () => { const bar = document.querySelector('#ft-progress'); const got = window.__ftPhases;
    if (bar && got[got.length - 1] !== bar.innerText) got.push(bar.innerText); };
  new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def fit_says(page, text: str, timeout_ms: int = 180_000) -> None:
    try:
        page.wait_for_function("(w) => document.querySelector('#ft-fit').innerText.includes(w)", arg=text,
                               timeout=timeout_ms)
    except PlaywrightTimeout:
        raise AssertionError(f"the fit check says {page.locator('#ft-fit').inner_text()!r}") from None


def dataset_options(page, text: str, then: str) -> list[str]:
    """The Dataset list's entries containing `text` (typed as the list's filter), then `then` picked."""
    box = page.locator("#ft-field-dataset input")
    box.click()
    box.fill(text)
    page.wait_for_timeout(1000)
    found = [o for o in page.locator(f"[id='{box.get_attribute('aria-controls')}'] li").all_inner_texts()
             if text in o]
    box.press("Escape")
    set_text(page, "ft-field-dataset", then)
    return found


def test_fit_time_preview_count_notices_and_removing_an_upload(studio, browser_context, tmp_path):
    url, model_dir, _ = studio
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, 40)
    fit_says(page, "min on this CPU: 40 steps")   # a measured step, scaled to the job
    page.locator("#ft-preview-btn").click()
    page.wait_for_selector("#ft-preview-count", timeout=90_000)
    assert "336 identity rows" in page.locator("#ft-preview-count").inner_text()   # 112 questions x 3 systems (issue 42)

    broken = tmp_path / "broken rows.json"
    broken.write_text("[{")
    stored = upload_dataset(page, broken, "/datasets/broken_rows-")
    page.wait_for_function("() => document.querySelector('#ft-upload-info').innerText.includes('cannot be read')",
                           timeout=30_000)
    assert upload_dataset(page, broken, "/datasets/broken_rows-") == stored   # the same file: the same entry
    # another dataset picked: the note is about no file now
    assert len(dataset_options(page, "broken_rows-", then="builtin:identity")) == 1
    page.wait_for_function("() => !document.querySelector('#ft-upload-info').innerText.includes('cannot be read')",
                           timeout=30_000)
    page.wait_for_selector("#ft-dataset-remove", state="hidden", timeout=30_000)   # a built-in: nothing to remove

    set_text(page, "ft-field-dataset", stored)
    page.locator("#ft-dataset-remove").click()
    page.wait_for_selector("#ft-dataset-remove-yes", state="visible", timeout=30_000)
    assert "broken_rows-" in page.locator("#ft-dataset-remove-text").inner_text()
    page.locator("#ft-dataset-remove-yes").click()
    page.wait_for_function("() => document.querySelector('#ft-upload-info').innerText.includes('Removed')",
                           timeout=30_000)
    assert page.locator("#ft-field-dataset input").input_value() == "builtin:identity"
    assert dataset_options(page, "broken_rows-", then="builtin:identity") == []
    page.close()


def test_one_job_phases_table_chat_chinese_and_merged_download(studio, browser_context, tmp_path):
    url, _, data_dir = studio
    fresh = make_tiny_model(data_dir / "models" / "tiny-newcomer")   # no cached answers: they are generated
    page = open_studio(browser_context, url)
    fill_job_form(page, fresh, 8, name="newcomer")
    page.evaluate(PHASE_WATCH)
    job = start_job(page)
    wait_for_state(page, ("done",), 300, min_step=8)
    phases = " | ".join(page.evaluate("() => window.__ftPhases"))
    # the job reports every phase; the page shows those a poll (every 1.5 s) falls in: on a fast machine
    # "loading model" of this tiny model lasts about a second, so one shown phase is what is certain
    reported = {e.get("phase") for e in read_events(data_dir / "jobs" / job) if e.get("type") == "phase"}
    assert {"preparing data", "tokenizing", "loading model"} <= reported, reported
    assert any(name in phases for name in ("preparing data", "tokenizing", "loading model")), phases[:2000]

    cell = page.locator("#ft-jobs-table .body-cell >> visible=true").first   # the newest job's id
    cell.click()
    page.wait_for_timeout(1000)
    # no editor opened (the table's own hidden file input for drops aside)
    assert page.locator("#ft-jobs-table input:not([type=file]), #ft-jobs-table textarea >> visible=true").count() == 0
    assert cell.evaluate("(td) => td.querySelector('[contenteditable=true]') === null")
    assert cell.evaluate("(td) => { const menu = td.querySelector('.cell-menu-button');"
                         " return [getComputedStyle(td).boxShadow, menu ? getComputedStyle(menu).display : 'none',"
                         " getComputedStyle(td).cursor]; }") == ["none", "none", "pointer"]   # nothing looks edited

    page.get_by_role("tab", name="Chat").click()
    page.wait_for_function("(id) => document.querySelector('#ft-chat-adapter input').value.includes(id)",
                           arg=job, timeout=60_000)

    merged_download(page, job, tmp_path)

    switch_language(page, "简体中文", "开始训练")
    page.get_by_role("tab", name="任务").click()
    page.wait_for_function("() => ['融合内核：关闭（PyTorch 路径）', '损失：只有标签行经过 LM head'].every("
                           "(line) => document.querySelector('#ft-kernel-report textarea').value.includes(line))",
                           timeout=60_000)   # the engine's lines, the CPU loss's (kernels/loss_patch.py) too
    page.get_by_role("tab", name="训练").click()
    set_text(page, "ft-field-max_steps", "12")
    command_has(page, "max_steps: 12")
    fit_says(page, "在本机 CPU 上")
    assert "本机引擎" in page.locator("#ft-header").inner_text()
    switch_language(page, "English", "Start")   # the choice is kept in the browser: the next tests' pages read English
    page.close()


def merged_download(page, job: str, tmp_path) -> None:
    page.get_by_role("tab", name="Export").click()
    pick_option(page, "ft-export-select", job)
    page.locator("#ft-export-format label", has_text="Merged model").click()
    page.locator("#ft-export-run").click()
    page.wait_for_function("() => document.querySelector('#ft-export-result').innerText.includes('Exported')",
                           timeout=300_000)
    page.wait_for_function("() => document.querySelector('#ft-export-files').innerText.includes('.zip')",
                           timeout=60_000)
    files = page.locator("#ft-export-files").inner_text().replace("\n", "")
    assert "config.json" in files
    link = page.locator("#ft-export-files tr", has_text=".zip").locator("a").first
    with page.expect_download(timeout=60_000) as download:
        link.click()
    archive = tmp_path / "merged.zip"
    download.value.save_as(archive)
    assert any(name.endswith("/config.json") for name in zipfile.ZipFile(archive).namelist())
