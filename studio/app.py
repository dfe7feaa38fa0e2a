"""build_studio(): the whole Gradio app. It builds the UI and wires the tabs together; it does not
launch, start threads or load models (app.py launches; models load on first chat/preview).

The page's language: a selector in the header, set on page load from the language this browser
picked before, else the browser's own (studio.i18n.DETECT_LANG_JS); every bound component's
text follows it, and every handler that writes text takes it as an input."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from studio.chat_tab import build_chat_tab
from studio.compare_tab import build_compare_tab
from studio.context import PICKER_REFRESH, StudioContext
from studio.evaluate_tab import build_evaluate_tab, evaluate_choices_update
from studio.export_tab import build_export_tab
from studio.i18n import DEFAULT_LANG, DETECT_LANG_JS, LANGUAGES, SAVE_LANG_JS, language_choices, normalize, t
from studio.jobs_tab import build_jobs_tab, refresh
from studio.server_text import translated
from studio.train_tab import build_train_tab

TITLE = "Fusetune Studio"


def header_text(fused: tuple[bool, str], lang: str) -> str:
    """The title, and which engine trains on this machine (and why not the other one)."""
    available, reason = fused
    engine = t("header.engine_fused" if available else "header.engine_torch", lang, reason=translated(reason, lang))
    return f"# {TITLE}\n{t('header.tagline', lang)}\n\n{engine}"


# The load chain refills the model/dataset choices: text typed into those fields before it ends can be
# replaced by the refill, so the page says when it is done (body[data-ft-ready]) for scripts and tests.
PAGE_READY_JS = "() => { document.body.dataset.ftReady = '1'; }"


def tab_labels_js() -> str:
    """Browser code that writes the tab names of the page's language into the tab bar.

    Gradio applies a label update to a tab only once the tab's content is mounted (a tab not yet
    opened keeps the name it was built with), so the names are also written here, by tab id."""
    names = {lang: {"train": t("tab.train", lang), "jobs": t("tab.jobs", lang), "compare": t("tab.compare", lang),
                    "export": t("tab.export", lang), "chat": t("tab.chat", lang),
                    "evaluate": t("tab.evaluate", lang)} for lang in LANGUAGES}
    return f"""(lang) => {{
  const names = {json.dumps(names, ensure_ascii=False)}[lang] || {{}};
  document.querySelectorAll('#ft-tabs [data-tab-id]').forEach((button) => {{
    const name = names[button.dataset.tabId];
    if (name && button.textContent !== name) button.textContent = name;
  }});
  return lang;
}}"""


# The jobs table is read-only (interactive=False), but Gradio still rings a clicked cell and shows
# its "⋮" menu, which reads as "this cell is being edited" (issue 24 item 8): a click opens the job.
PAGE_CSS = """
#ft-jobs-table .body-cell { cursor: pointer; }
#ft-jobs-table .body-cell.cell-selected { box-shadow: none !important; }
#ft-jobs-table .body-cell .cell-menu-button { display: none !important; }
#ft-chat-image [data-testid="upload-text"] .prompt { white-space: normal; text-align: center; }
"""


@dataclass
class _Tabs:
    """The built tabs and their tab items (an item's select event refreshes its tab)."""
    tabs: Any
    train: Any
    jobs: Any
    compare: Any
    export: Any
    chat: Any
    evaluate_select: Any
    items: dict[str, Any]


def build_studio(data_dir: Path, runner: Any, context: StudioContext | None = None) -> gr.Blocks:
    """The studio for `data_dir`, submitting jobs through `runner` (a jobs.queue.runner.Runner)."""
    ctx = context or StudioContext(data_dir=Path(data_dir), runner=runner)
    fused = ctx.fused_kernels()
    bind = ctx.page.bind
    # analytics off: no version-check thread, and nothing outside is reachable anyway
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        with gr.Row(equal_height=False):
            bind(gr.Markdown(elem_id="ft-header"), value=lambda lang: header_text(fused, lang))
            ctx.lang = bind(gr.Dropdown(choices=language_choices(), value=DEFAULT_LANG, elem_id="ft-lang",
                                        scale=0, min_width=160, container=True), label="header.language")
        built = _build_tabs(ctx)
        _wire_tab_switches(ctx, built)
        _wire_page_load(ctx, demo, built)
    return demo


def _build_tabs(ctx: StudioContext) -> _Tabs:
    bind, items = ctx.page.bind, {}
    with gr.Tabs(elem_id="ft-tabs") as tabs:
        with bind(gr.Tab(id="train", elem_id="ft-tab-train"), label="tab.train"):
            train = build_train_tab(ctx)
        with bind(gr.Tab(id="jobs", elem_id="ft-tab-jobs"), label="tab.jobs") as items["jobs"]:
            jobs = build_jobs_tab(ctx)
        with bind(gr.Tab(id="compare", elem_id="ft-tab-compare"), label="tab.compare") as items["compare"]:
            compare = build_compare_tab(ctx)
        with bind(gr.Tab(id="export", elem_id="ft-tab-export"), label="tab.export") as items["export"]:
            export = build_export_tab(ctx)
        with bind(gr.Tab(id="chat", elem_id="ft-tab-chat"), label="tab.chat") as items["chat"]:
            chat = build_chat_tab(ctx)
        with bind(gr.Tab(id="evaluate", elem_id="ft-tab-evaluate"), label="tab.evaluate") as items["evaluate"]:
            evaluate_select = build_evaluate_tab(ctx)
    return _Tabs(tabs, train, jobs, compare, export, chat, evaluate_select, items)


def _wire_tab_switches(ctx: StudioContext, built: _Tabs) -> None:
    """A started job opens the Jobs tab; each tab refreshes when it is opened; Chat follows jobs that end."""
    lang, jobs, compare, export, chat, items = ctx.lang, built.jobs, built.compare, built.export, built.chat, built.items

    def after_start(job_id: str, language: str, request: gr.Request) -> list[Any]:
        if not job_id:
            return [gr.skip()] * (1 + len(jobs.refresh_outputs))
        return [gr.Tabs(selected="jobs"),
                *refresh(ctx, job_id, None, None, language, pick=True, page=request.session_hash or "")]

    built.train.started_job.change(after_start, [built.train.started_job, lang], [built.tabs, *jobs.refresh_outputs],
                                   show_progress="hidden")
    items["jobs"].select(lambda job_id, language: refresh(ctx, job_id, None, None, language),
                         [jobs.select, lang], jobs.refresh_outputs, show_progress="hidden")
    # the refresh redraws the chart without touching the picks, so no pick's change follows with the
    # colour sync (Gradio 6.31 fires one anyway, a quirk studio/compare_tab.py on_view_change absorbs)
    compare.sync_colors(items["compare"].select(
        lambda picked, only, language: compare.refresh(ctx, picked, only, language),
        [compare.select, compare.only_diff, lang], compare.outputs, show_progress="hidden"))
    items["export"].select(lambda picked, language: export.refresh(ctx, picked, language),
                           [export.picked, lang], export.select, show_progress="hidden", **PICKER_REFRESH)
    items["evaluate"].select(lambda picked, language: evaluate_choices_update(ctx, picked, language),
                             [built.evaluate_select, lang], built.evaluate_select, show_progress="hidden",
                             **PICKER_REFRESH)
    items["chat"].select(lambda language, current, auto: chat.refresh(ctx, language, current, auto),
                         [lang, chat.adapter, chat.auto], [chat.adapter, chat.model, chat.auto], show_progress="hidden",
                         **PICKER_REFRESH)

    # a job that ends while the Chat tab is open joins its adapter list (the Jobs poll sees it end)
    def follow_jobs(language: str, current: str | None, auto: str | None, known: Any) -> list[Any]:
        return chat.follow_jobs(ctx, language, current, auto, known)

    jobs.table_sig.change(follow_jobs, [lang, chat.adapter, chat.auto, chat.known],
                          [chat.adapter, chat.model, chat.auto, chat.known], show_progress="hidden", **PICKER_REFRESH)


def _wire_page_load(ctx: StudioContext, demo: gr.Blocks, built: _Tabs) -> None:
    """Page load and a language switch: the language first, then the tab names, the fit check and the
    choices the load refills; the page says when it is ready."""
    lang, train, jobs, export, chat = ctx.lang, built.train, built.jobs, built.export, built.chat

    def on_language(language: str | None) -> list[Any]:
        language = normalize(language)
        return [gr.update(value=language), *ctx.page.updates(language)]

    def on_load(language: str) -> list[Any]:
        return [*refresh(ctx, None, None, None, language), export.refresh(ctx, None, language),
                *chat.refresh(ctx, language), *train.refresh_choices(ctx, language)]

    def fit_check(language: str, *values: Any) -> str:
        return train.fit_check(ctx, language, *values)

    page_outputs = [lang, *ctx.page.components()]
    tab_names = tab_labels_js()
    # language first, so everything the load then writes is already in it
    quiet = {"show_progress": "hidden"}  # a spinner over every field would block the form
    loaded = demo.load(on_language, lang, page_outputs, js=DETECT_LANG_JS, **quiet)
    loaded.then(None, lang, None, js=tab_names)
    loaded.then(fit_check, [lang, *train.inputs], train.fit, **quiet)
    filled = loaded.then(on_load, lang, [*jobs.refresh_outputs, export.select, chat.adapter, chat.model,
                                         chat.auto, train.model, train.dataset, train.gpu_boxes, train.budget],
                         **quiet, **PICKER_REFRESH)
    filled.then(None, None, None, js=PAGE_READY_JS)
    switched = lang.input(on_language, lang, page_outputs, js=SAVE_LANG_JS, **quiet)
    switched.then(None, lang, None, js=tab_names)
    switched.then(fit_check, [lang, *train.inputs], train.fit, **quiet)
    switched.then(lambda language: train.gpu_update(ctx, language), lang, train.gpu_boxes, **quiet)
