"""Issue 24's last item in a real browser: in the 简体中文 page, the upload notice of a dataset with
bad rows names each row in Chinese (jobs/messages/ templates, studio/server_text.py), while the
parser's own words stay as written; the page is set back to English at the end."""
from __future__ import annotations

import json
from contextlib import closing

from tests.e2e.browser import new_context
from tests.e2e.studio_page import fill_job_form, open_studio, switch_language

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
NO_ANSWER = {"messages": [{"role": "user", "content": "only a question"}]}


def _upload(page, path) -> None:
    with page.expect_file_chooser() as chooser:
        page.locator("#ft-upload").click()
    chooser.value.set_files(str(path))


def test_bad_rows_are_named_in_chinese(studio, browser, tmp_path):
    url, model_dir, _ = studio
    bad_json = tmp_path / "zh_bad_json.jsonl"      # the upload notice reads the rows: row 2 is cut off
    bad_json.write_text("\n".join([json.dumps(GOOD), '{"messages": [', json.dumps(NO_ANSWER)]) + "\n")
    no_answer = tmp_path / "zh_no_answer.jsonl"    # valid JSON: the preview's conversion names row 2
    no_answer.write_text("\n".join([json.dumps(GOOD), json.dumps(NO_ANSWER)]) + "\n")
    with closing(new_context(browser, "en-US")) as context:
        page = open_studio(context, url)
        switch_language(page, "简体中文", "开始训练")
        fill_job_form(page, model_dir, 5)   # the tiny model: the preview needs a tokenizer

        _upload(page, bad_json)
        page.wait_for_function("() => document.querySelector('#ft-upload-info').innerText.includes('错误数据')",
                               timeout=90_000)
        info = page.locator("#ft-upload-info").inner_text()
        assert "有 1 条错误数据：第 2 条（第 2 行）不是有效的 JSON（第 15 列）" in info, info
        assert "is not valid JSON" not in info and "bad row" not in info

        _upload(page, no_answer)
        page.wait_for_function("() => document.querySelector('#ft-upload-info').innerText.includes('zh_no_answer')",
                               timeout=90_000)
        page.locator("#ft-preview-btn").click()
        page.wait_for_function("() => document.querySelector('#ft-preview').innerText.includes('assistant 轮次')",
                               timeout=90_000)
        preview = page.locator("#ft-preview").inner_text()
        assert "第 2 条（第 2 行，messages）：没有 assistant 轮次，因此没有可训练的内容" in preview, preview
        assert "has no assistant turn" not in preview
        switch_language(page, "English", "Start training")   # the choice is kept in the browser's storage
        page.close()
