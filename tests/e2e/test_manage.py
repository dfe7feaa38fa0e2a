"""Jobs you can manage and compare, in a real browser: a named job, remove a queued job, cancel
and delete only the picked job and only after saying yes; two runs compared on one chart with
their differing config keys marked."""
from __future__ import annotations

from tests.e2e.studio_page import (command_has, confirm, fill_job_form, notice, open_studio, pick_job, pick_option,
                                   set_text, start_job, wait_for_state)


def table_lacks(page, job_id: str) -> None:
    page.wait_for_function("(id) => !document.querySelector('#ft-jobs-table').innerText.includes(id)",
                           arg=job_id, timeout=30_000)


def test_name_remove_cancel_delete(studio, browser_context):
    url, model_dir, data_dir = studio
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, 5000, name="runner A")
    running = start_job(page)
    wait_for_state(page, ("running",), 180, min_step=1)

    page.get_by_role("tab", name="Train").click()
    set_text(page, "ft-field-name", "waiting B")
    queued = start_job(page)  # picked for the user: they just started it
    assert queued != running
    # a poll sent before Start's pick sends none of the running job's detail (tests/studio/test_jobs_tab.py)
    wait_for_state(page, ("queued",), 30)
    assert page.locator("#ft-remove").is_visible() and not page.locator("#ft-cancel").is_visible()
    assert "waiting B" in page.locator("#ft-jobs-table").inner_text()

    confirm(page, "remove", queued, "no")  # "no" changes nothing
    wait_for_state(page, ("queued",), 10)
    confirm(page, "remove", queued, "yes")
    notice(page, f"Removed job {queued} from the queue.")
    table_lacks(page, queued)
    assert not (data_dir / "jobs" / queued).exists()

    pick_job(page, running)
    wait_for_state(page, ("running",), 30)
    confirm(page, "cancel", running, "no")
    wait_for_state(page, ("running",), 10)
    confirm(page, "cancel", running, "yes")
    wait_for_state(page, ("cancelled",), 120)

    question = confirm(page, "delete", running, "yes")
    assert str(data_dir / "jobs" / running) in question and "cannot be undone" in question
    notice(page, f"Deleted job {running} and its folder.")
    table_lacks(page, running)
    assert page.locator("#ft-job-select input").input_value() == ""
    assert not (data_dir / "jobs" / running).exists()
    page.close()


def test_compare_two_runs(studio, browser_context):
    url, model_dir, _ = studio
    page = open_studio(browser_context, url)
    ids = []
    for name, steps, rank in (("compare small", 4, "8"), ("compare big", 6, "16")):
        page.get_by_role("tab", name="Train").click()
        fill_job_form(page, model_dir, steps, name=name)
        set_text(page, "ft-field-lora_r", rank)
        command_has(page, f"lora_r: {rank}")  # Start sends what the form holds once it has taken the rank
        ids.append(start_job(page))
    assert ids[0] != ids[1]
    # issue 40 item 10: the Chat tab open while the second job runs picks its adapter once it ends,
    # without a reload or another tab switch (the Jobs poll's table change refreshes the list)
    page.get_by_role("tab", name="Chat").click()
    page.wait_for_function("(id) => document.querySelector('#ft-chat-adapter input').value.includes(id)",
                           arg=ids[1], timeout=240_000)
    page.get_by_role("tab", name="Jobs").click()
    for job_id in ids:
        pick_job(page, job_id)
        wait_for_state(page, ("done",), 240)

    page.get_by_role("tab", name="Compare").click()
    for job_id in ids:
        pick_option(page, "ft-compare-select", job_id)
    # the legend names each run in full below the chart (vega's own cut names at 160 px)
    for name, job_id in zip(("compare small", "compare big"), ids):
        page.wait_for_function("(text) => document.querySelector('#ft-compare-legend').innerText.includes(text)",
                               arg=f"{name} ({job_id}) · training loss", timeout=30_000)
    for width in (1280, 1440, 1920):   # every name whole and inside the box, wrapping where it must
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)
        assert page.locator("#ft-compare-legend .ft-legend-item").evaluate_all(
            "items => { const box = document.querySelector('#ft-compare-legend').getBoundingClientRect();"
            " return items.length >= 2 && items.every(i => i.scrollWidth <= i.clientWidth + 1"
            " && i.getBoundingClientRect().right <= box.right + 1); }"), width
    # the table is drawn for the first pick too: wait until it compares both runs
    page.wait_for_function("() => document.querySelectorAll('#ft-compare-config th').length >= 3"
                           " && document.querySelector('#ft-compare-config tr[data-key=\"lora_r\"]')", timeout=30_000)
    assert page.locator("#ft-compare-plot canvas, #ft-compare-plot svg").count() > 0
    lora = page.locator('#ft-compare-config tr[data-key="lora_r"]')
    assert lora.get_attribute("class") == "ft-diff" and "≠" in lora.inner_text(), (ids, lora.inner_text())
    assert "8" in lora.inner_text() and "16" in lora.inner_text()
    assert page.locator('#ft-compare-config tr[data-key="seed"]').get_attribute("class") == "ft-same"
    page.locator("#ft-compare-only-diff input").check()
    page.wait_for_selector('#ft-compare-config tr[data-key="seed"]', state="detached", timeout=15_000)
    keys = page.locator("#ft-compare-config tr[data-key]").evaluate_all("rows => rows.map(r => r.dataset.key)")
    assert set(keys) == {"name", "lora_r", "max_steps"}
    page.close()
