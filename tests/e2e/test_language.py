"""English and 简体中文 in a real browser: the page opens in the browser's language, the selector
switches every label, help text and message, and the choice is remembered."""
from __future__ import annotations

from contextlib import closing

from tests.e2e.browser import new_context
from tests.e2e.studio_page import command_has, open_studio, set_text, switch_language

TABS_ZH = ["训练", "任务", "对比", "导出", "对话", "评测"]
TABS_EN = ["Train", "Jobs", "Compare", "Export", "Chat", "Evaluate"]


def tab_names(page) -> list[str]:
    return [name.strip() for name in page.locator("#ft-tabs [role=tab]").all_inner_texts()]


def test_chinese_browser_gets_chinese_and_can_switch(studio, browser):
    url, _, _ = studio
    with closing(new_context(browser, "zh-CN")) as context:
        page = open_studio(context, url, ready_text="开始训练")
        page.wait_for_function("(names) => names.every((n, i) => document.querySelectorAll("
                               "'#ft-tabs [role=tab]')[i].innerText.trim() === n)", arg=TABS_ZH, timeout=30_000)
        batch = page.locator("#ft-field-batch_size").inner_text()
        assert "批大小" in batch and "每个微批次的样本数" in batch  # label and JobSpec help, translated
        assert "本机引擎" in page.locator("#ft-header").inner_text()

        set_text(page, "ft-field-batch_size", "abc")
        command_has(page, "修正以下问题后才能开始", "批大小（batch_size）：“abc”不是数字")
        page.locator("#ft-start").click()
        page.wait_for_function("() => document.querySelector('#ft-train-status').innerText"
                               ".includes('未开始。批大小（batch_size）')", timeout=20_000)

        switch_language(page, "English", "Start training")
        page.wait_for_function("(names) => names.every((n, i) => document.querySelectorAll("
                               "'#ft-tabs [role=tab]')[i].innerText.trim() === n)", arg=TABS_EN, timeout=30_000)
        command_has(page, "Start is blocked", "Batch size (batch_size): 'abc' is not a number")
        assert "Examples per micro-batch." in page.locator("#ft-field-batch_size").inner_text()

        page.reload()  # remembered on this browser, over the browser's own language
        page.wait_for_selector("#ft-start", timeout=90_000)
        page.wait_for_timeout(3000)
        assert page.locator("#ft-start").inner_text().strip() == "Start training"
        assert tab_names(page) == TABS_EN

        switch_language(page, "简体中文", "开始训练")
        page.get_by_role("tab", name="任务").click()
        page.wait_for_function("() => document.querySelector('#ft-jobs-table').innerText.includes('状态')",
                               timeout=30_000)
        page.close()
