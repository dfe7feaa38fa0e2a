"""Start's preflight in the browser: a CSV with bad rows is refused at Start, naming the rows, and
nothing is queued; a path outside the studio's folders is refused like a missing one; the fit
check says where the job runs."""
from __future__ import annotations

from tests.e2e.studio_page import command_has, fill_job_form, open_studio, selected_tab, set_text, upload_dataset


def status_has(page, text: str, timeout_ms: int = 60_000) -> str:
    page.wait_for_function("(w) => document.querySelector('#ft-train-status').innerText.includes(w)",
                           arg=text, timeout=timeout_ms)
    return page.locator("#ft-train-status").inner_text()


def test_bad_rows_are_refused_at_start_and_nothing_is_queued(studio, browser_context, tmp_path):
    url, model_dir, _ = studio
    rows = tmp_path / "bad rows.csv"
    body = [f"q{i},,a{i}" for i in range(20)]
    body[2:2] = ["q-bad1,,", "q-bad2,,"]   # rows 3 and 4: no answer
    rows.write_text("instruction,input,output\n" + "\n".join(body) + "\n")
    page = open_studio(browser_context, url)
    page.wait_for_function("() => document.querySelector('#ft-fit').innerText.includes('runs on the CPU')",
                           timeout=60_000)   # this CI box has no GPU: the fit check says so
    fill_job_form(page, model_dir, 5, name="bad rows")
    upload_dataset(page, rows, "/datasets/bad_rows-")
    page.wait_for_function("() => document.querySelector('#ft-upload-info').innerText.includes('22 rows')",
                           timeout=30_000)
    # the rate that follows the dataset (identity's 4e-4 -> the default) came with the upload's note
    assert page.locator("#ft-field-learning_rate input").input_value() == "0.0002"
    page.locator("#ft-start").click()
    text = status_has(page, "Not queued")
    assert "Dataset (dataset)" in text and "2 bad rows" in text
    assert "row 3 (line 4" in text and "row 4 (line 5" in text
    assert selected_tab(page) == "Train"   # Start switches to the Jobs tab only when it queued a job
    page.wait_for_timeout(1000)   # the upload's chained field redraws landing late keep the refusal shown
    assert "row 3 (line 4" in page.locator("#ft-train-status").inner_text()

    page.get_by_role("tab", name="Jobs").click()   # nothing was queued
    page.wait_for_selector("#ft-jobs-table", timeout=30_000)
    page.wait_for_timeout(1500)
    assert "bad rows" not in page.locator("#ft-jobs-table").inner_text()

    page.get_by_role("tab", name="Train").click()
    set_text(page, "ft-field-dataset", "/etc/hostname.csv")   # outside the studio's folders
    command_has(page, "Start is blocked", "is not available to the studio")
    page.locator("#ft-start").click()
    assert "is not available to the studio" in status_has(page, "Not started")
    page.close()


def test_the_fp8_switch_is_off_with_its_reason_in_one_line(studio, browser_context):
    """On this CPU box the FP8 switch cannot be turned on (a click leaves it off) and its help says
    in one line why; the H200 figures a newcomer here cannot use are not shown (issue 24 item 6; on a
    GPU that can run it the help states the measured effect, studio/fp8_effect.py)."""
    url, _, _ = studio
    page = open_studio(browser_context, url)
    field = page.locator("#ft-field-base_precision")
    box = field.locator("input[type=checkbox]")
    assert box.is_disabled() and not box.is_checked()
    field.click(force=True)
    page.wait_for_timeout(500)
    assert not box.is_checked()
    text = field.inner_text()
    assert "Unavailable here: FP8 matrix products need a CUDA GPU" in text, text   # why it is off here
    assert "Measured on" not in text and len(text.strip().splitlines()) == 2, text   # the label, the reason
    page.close()
