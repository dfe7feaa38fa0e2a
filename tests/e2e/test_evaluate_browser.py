"""Evaluate in a real browser: train the tiny model from the form, then on the Evaluate tab pick the
job, upload eval rows and press Evaluate: the base-vs-tuned table (with its interval), the rows with
both answers and the files to download appear (the evaluation ran through the job queue); Compare then
shows it for the job."""
from __future__ import annotations

import json

from tests.e2e.studio_page import (fill_job_form, open_studio, pick_option, set_text, start_job, upload_file,
                                   wait_for_state)

ROWS = [("What is the capital of France?", "The capital of France is Paris."),
        ("Who are you?", "I am Fusetune."), ("Name a colour.", "Blue is a colour.")]


def test_evaluate_a_finished_job(studio, browser_context, tmp_path):
    url, model_dir, _ = studio
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, 4, name="to evaluate")
    job_id = start_job(page)
    state, _ = wait_for_state(page, ("done", "failed", "cancelled"), 300)
    assert state == "done"
    rows = tmp_path / "eval.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n" for q, a in ROWS))

    page.get_by_role("tab", name="Evaluate").click()
    pick_option(page, "ft-eval-select", job_id)
    upload_file(page, "ft-eval-upload", rows, "ft-eval-file")
    page.locator("#ft-eval-clear").click()   # back to the held-out data, then the file again
    page.wait_for_function("() => !document.querySelector('#ft-eval-file').innerText.includes('eval.jsonl')",
                           timeout=30_000)
    upload_file(page, "ft-eval-upload", rows, "ft-eval-file")
    set_text(page, "ft-eval-max-new", "8")
    page.locator("#ft-eval-run").click()
    page.wait_for_function("() => document.querySelector('#ft-eval-status').innerText.includes('Evaluated')",
                           timeout=300_000)
    table = page.locator("#ft-eval-table").inner_text()
    assert all(metric in table for metric in ("exact_match", "rouge_l", "bleu", "chrf")) and "[" in table
    per_row = page.locator("#ft-eval-rows").inner_text()
    assert "change exact_match" in per_row and "The capital of France is Paris." in per_row
    files = page.locator("#ft-eval-files").inner_text().replace("\n", "")
    assert "rows.csv" in files and "rows.jsonl" in files and "results.json" in files

    page.get_by_role("tab", name="Compare").click()   # the same evaluation, beside the job's other results
    pick_option(page, "ft-compare-select", job_id)
    page.wait_for_function("() => (document.querySelector('#ft-compare-evals') || {innerText: ''})"
                           ".innerText.includes('exact_match')", timeout=30_000)
    assert f"to evaluate ({job_id})" in page.locator("#ft-compare-evals").inner_text()
    page.close()
