"""Export in a real browser: train the tiny model from the form, export it as a q8_0 GGUF from the
Export tab (progress shown, files listed with sizes, Modelfile offered), then pick that GGUF as the
Chat tab's model and get an answer from it."""
from __future__ import annotations

import pytest

from tests.e2e.browser import CHROMIUM
from tests.e2e.studio_page import fill_job_form, open_studio, pick_option, start_job, wait_for_state

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)")

WATCH_RESULT = """() => {
  window.__ftExport = [];
  const root = document.querySelector('#ft-export-result');
  new MutationObserver(() => window.__ftExport.push(root.innerText))
    .observe(root, {subtree: true, childList: true, characterData: true});
}"""


def test_export_a_gguf_and_chat_with_it(studio, browser_context):
    """On the session's studio and chromium (a studio of its own cost a second start and fit
    measurement, beside the session's that the autouse no_job_left_running starts anyway)."""
    url, model_dir, _ = studio
    page = open_studio(browser_context, url)
    fill_job_form(page, model_dir, 10)
    job_id = start_job(page)
    state, _ = wait_for_state(page, ("done", "failed", "cancelled"), 300)
    assert state == "done"

    page.get_by_role("tab", name="Export").click()
    pick_option(page, "ft-export-select", job_id)
    page.locator("#ft-export-format label", has_text="GGUF for llama.cpp").click()
    pick_option(page, "ft-export-quant", "q8_0")
    page.evaluate(WATCH_RESULT)
    page.locator("#ft-export-run").click()
    page.wait_for_function("() => document.querySelector('#ft-export-result').innerText.includes('Exported')",
                           timeout=300_000)
    result = page.locator("#ft-export-result").inner_text()
    assert "tiny-ft-q8_0.gguf" in result and " KB" in result and "ollama create" in result
    seen = " ".join(page.evaluate("() => window.__ftExport"))
    assert "wrote" in seen or "%" in seen  # the progress bar showed the CLI's progress
    files = page.locator("#ft-export-files").inner_text().replace("\n", "")  # names wrap before the suffix
    assert "tiny-ft-q8_0.gguf" in files and "Modelfile" in files and "KB" in files

    page.get_by_role("tab", name="Chat").click()
    pick_option(page, "ft-chat-model", "export: tiny-ft-q8_0.gguf")
    page.wait_for_function("() => document.querySelector('#ft-chat-adapter input').value.includes('none')",
                           timeout=10_000)
    page.locator("#ft-chat-input textarea").fill("Who are you?")
    page.locator("#ft-chat-send").click()
    page.wait_for_function("() => { const b = document.querySelectorAll('#ft-chat-base [data-testid=\"bot\"]');"
                           " return b.length && b[b.length-1].innerText.trim().length > 0"
                           " && !b[b.length-1].innerText.includes('loading the model'); }", timeout=180_000)
    assert "Generation failed" not in page.locator("#ft-chat-base").inner_text()
    page.close()
