"""Preference tuning in a real browser (issue 19): pick DPO (its keys appear, SimPO's stay hidden),
upload a preference file (described as preference rows, its pairs previewed by themselves: the
templated prompt, then chosen beside rejected), Start, and see the Jobs tab draw the reward margin
and accuracy beside the loss: lines with points, not only axes. Checked through the page only."""
from __future__ import annotations

import json

from tests.e2e.studio_page import (command_has, fill_job_form, open_studio, pick_job, pick_option, start_job,
                                   upload_dataset, wait_for_state)

STEPS = 12
# A line's path in the SVG Vega draws (renderer svg): "M x,y L x,y ..." has one L per further point.
LINE_POINTS = """(id) => {
  const paths = [...document.querySelectorAll('#' + id + ' g.mark-line path')];
  return Math.max(0, ...paths.map((p) => ((p.getAttribute('d') || '').match(/L/g) || []).length + 1));
}"""


# The plotted area of a chart: the box its lines span (width, height), in CSS pixels.
PLOTTED = """(id) => {
  const boxes = [...document.querySelectorAll('#' + id + ' g.mark-line path')].map((e) => e.getBoundingClientRect())
    .filter((b) => b.width || b.height);
  if (!boxes.length) return [0, 0];
  return [Math.max(...boxes.map((b) => b.right)) - Math.min(...boxes.map((b) => b.left)),
          Math.max(...boxes.map((b) => b.bottom)) - Math.min(...boxes.map((b) => b.top))];
}"""


def pairs_file(path):
    rows = [{"prompt": f"Is {i} a number?", "chosen": "Yes.", "rejected": f"No <{i}> is a fish, sadly."}
            for i in range(16)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_dpo_from_the_form_previews_pairs_and_plots_the_margin(studio, browser_context, tmp_path):
    url, model_dir, _ = studio
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, STEPS, name="dpo run")
    page.wait_for_selector("#ft-field-beta", state="hidden", timeout=10_000)  # sft: no preference keys
    page.locator("#ft-preview-btn").click()   # the identity rows, previewed under sft
    page.wait_for_selector("#ft-preview-rows", timeout=90_000)
    pick_option(page, "ft-field-method", "dpo")
    # issue 40: the identity preview stayed under the swapped-in preference set
    page.wait_for_selector("#ft-preview-rows", state="detached", timeout=30_000)
    page.wait_for_selector("#ft-field-beta", state="visible", timeout=30_000)
    assert not page.locator("#ft-field-simpo_gamma").is_visible()  # SimPO's key, not DPO's
    command_has(page, "method: dpo", "dataset: builtin:concise")  # the built-in set that fits DPO

    stored = upload_dataset(page, pairs_file(tmp_path / "pairs.jsonl"), "/datasets/pairs-")
    page.wait_for_function("() => document.querySelector('#ft-upload-info').innerText"
                           ".includes('preference rows (explicit) format, 16 rows')", timeout=30_000)
    page.wait_for_selector("#ft-preview-pairs .ft-chosen", timeout=90_000)  # by itself, after the upload
    pair = page.locator("#ft-preview-pairs .ft-pair").first
    assert "Is 0 a number?" in pair.locator(".ft-pair-prompt").inner_text()
    assert "<|im_start|>assistant" in pair.locator(".ft-pair-prompt").inner_text()
    assert "Yes." in pair.locator(".ft-chosen .ft-answer").inner_text()
    assert "No <0> is a fish" in pair.locator(".ft-rejected .ft-answer").inner_text()
    command_has(page, f"dataset: {stored}", "method: dpo")

    start_job(page)
    state, step = wait_for_state(page, ("done", "failed", "cancelled"), 300)
    assert (state, step) == ("done", STEPS), page.locator("#ft-job-failure").inner_text()
    page.wait_for_selector("#ft-reward-plot", state="visible", timeout=30_000)
    page.wait_for_function(f"(id) => ({LINE_POINTS})(id) >= {STEPS}", arg="ft-reward-plot", timeout=30_000)
    legend = page.locator("#ft-reward-plot").inner_text()
    assert "reward margin" in legend and "reward accuracy" in legend
    # the loss beside it, drawn by vega from the same answer, maybe a moment later
    page.wait_for_function(f"(id) => ({LINE_POINTS})(id) >= {STEPS}", arg="ft-loss-plot", timeout=30_000)
    job_id = page.locator("#ft-job-select input").input_value().split(" · ")[0]
    for width in (1280, 1440, 1920):   # issue 40: 74 px tall at 1440, 0 px after a reload
        page.set_viewport_size({"width": width, "height": 1000})
        for reloaded in (False, True):
            if reloaded:
                page.reload()
                page.wait_for_function("() => document.body.dataset.ftReady === '1'", timeout=90_000)
                page.get_by_role("tab", name="Jobs").click()
                pick_job(page, job_id)
            page.wait_for_function(f"(id) => ({LINE_POINTS})(id) >= {STEPS}", arg="ft-reward-plot", timeout=30_000)
            wide, tall = page.evaluate(PLOTTED, "ft-reward-plot")
            assert wide >= 250 and tall >= 100, (width, reloaded, wide, tall)
    page.close()
