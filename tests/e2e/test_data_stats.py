"""Dataset statistics in the browser (issue 22 item 7): a dataset with long rows gets its token-length
histograms (prompt and answer), the truncation and duplicate counts, and a warning beside Start
that max_seq_length cuts answers (after the statistics button, and after Start); a roomier
max_seq_length clears the warning."""
from __future__ import annotations

import json

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.e2e.studio_page import command_has, fill_job_form, open_studio, set_text, upload_dataset


# what the statistics box showed, with the milliseconds since the click: a failure tells an event that
# never ran from one whose numbers were drawn and then cleared
WATCH_STATS_JS = """() => {
  const box = document.querySelector('#ft-data-stats'), start = performance.now(), seen = window.__ftStatsSeen = [];
  new MutationObserver(() => seen.push([Math.round(performance.now() - start), box.innerText.slice(0, 60)]))
    .observe(box, {subtree: true, childList: true, characterData: true});
}"""


def click_stats_and_wait_for_histogram(page) -> None:
    """The statistics button clicked and its histograms drawn; else a failure that says what the
    page showed instead, and what the statistics box showed on the way."""
    page.evaluate(WATCH_STATS_JS)
    page.locator("#ft-stats-btn").click()
    try:
        page.wait_for_selector("#ft-data-stats .ft-histogram[data-part=answer]", timeout=120_000)
    except PlaywrightTimeout:
        shown = {box: page.locator(box).inner_text() for box in ("#ft-data-stats", "#ft-train-status", "#ft-command")}
        history = page.evaluate("() => window.__ftStatsSeen")
        raise AssertionError(f"no histogram after 120 s; the statistics box showed {history}; "
                             f"the page shows {shown}") from None


def test_long_rows_show_a_histogram_and_a_warning_beside_start(studio, browser_context, shots, tmp_path):
    url, model_dir, _ = studio
    rows = [{"instruction": f"Question {i}", "input": "", "output": f"Answer {i}."} for i in range(12)]
    rows += [{"instruction": "Tell me everything", "input": "", "output": " ".join(["word"] * 60)}] * 2
    path = tmp_path / "long rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, 5, name="stats")
    upload_dataset(page, path, "/datasets/long_rows-")
    set_text(page, "ft-field-max_seq_length", "64")
    command_has(page, "max_seq_length: 64")
    click_stats_and_wait_for_histogram(page)
    stats = page.locator("#ft-data-stats").inner_text()
    assert "14 rows" in stats and "2 rows are longer than max_seq_length=64" in stats, stats
    assert "Duplicate rows (exact repeats of an earlier row): 1" in stats, stats
    assert "Trained tokens" in stats
    bars = page.locator("#ft-data-stats .ft-histogram[data-part=prompt] .ft-bar")
    assert sum(int(bars.nth(i).get_attribute("data-rows")) for i in range(bars.count())) == 14
    axis = page.locator("#ft-data-stats .ft-histogram[data-part=prompt] .ft-axis span")   # issue 40: labelled
    assert axis.count() == 5 and axis.first.inner_text() == "0"
    assert "tokens per row" in page.locator("#ft-data-stats .ft-histogram[data-part=prompt] .ft-axis-title").inner_text()
    warning = page.locator("#ft-data-warning").inner_text()
    assert "max_seq_length=64 cuts the answers of 2 of 14 rows" in warning, warning
    page.screenshot(path=str(shots / "data-stats.png"), full_page=True)

    set_text(page, "ft-field-max_seq_length", "400")   # the old numbers are stale: cleared
    page.wait_for_function("() => !document.querySelector('#ft-data-warning').innerText.trim()", timeout=30_000)
    page.locator("#ft-stats-btn").click()
    page.wait_for_function("() => document.querySelector('#ft-data-stats').innerText.includes('No row is longer')",
                           timeout=120_000)
    assert page.locator("#ft-data-warning").inner_text().strip() == ""

    # Start measures the data too: the warning appears after a Start press without the button
    set_text(page, "ft-field-max_seq_length", "64")
    command_has(page, "max_seq_length: 64")
    page.locator("#ft-start").click()
    page.wait_for_function("() => document.querySelector('#ft-data-warning').innerText.includes('cuts the answers')",
                           timeout=120_000)
    page.close()
