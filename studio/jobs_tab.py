"""The Jobs tab: every job in a table; the picked one's progress, curves, kernel report, log and
the actions it offers (cancel, remove from the queue, delete), each confirmed first.

A gr.Timer polls every POLL_S seconds. All state is read from disk (the SQLite store and the job's
events.jsonl / train.log), so a reopened browser shows exactly what the job is doing; the job
never depends on the page. Each poll re-sends only what changed (a per-browser signature).

Only the user picks the job shown and acted on (a table row or the list; Start picks the job it
started): a poll never changes the selection, so an action never lands on a job the user did
not choose.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from jobs.io.events import tail_log
from jobs.io.layout import JobLayout
from studio import job_actions
from studio import jobs_view as view
from studio import render
from studio import reward_view
from studio.context import StudioContext
from studio.i18n import t

POLL_S = 1.5
LOG_LINES = 200
GB_FORMAT = ".2~f"  # d3 format: 1.83, not 1.827000 on a flat curve


@dataclass
class JobsTab:
    table: gr.Dataframe
    select: gr.Dropdown
    timer: gr.Timer
    refresh_outputs: list[Any]  # what refresh() returns values for, in order


def table_and_choices(ctx: StudioContext, lang: str) -> tuple[list[Any], pd.DataFrame, list[tuple[str, str]]]:
    records = ctx.runner.list_jobs()
    rows = [view.job_row(r, ctx.events.get(r.job_dir), lang) for r in records]
    table = pd.DataFrame(rows, columns=view.table_headers(lang))
    return records, table, [view.job_choice(r, lang) for r in records]


def detail(ctx: StudioContext, record: Any, lang: str) -> list[Any]:
    """progress, failure, loss, rss, cpu, gpu util, gpu mem, rewards, kernel report, log, 3 action buttons."""
    summary = ctx.events.get(record.job_dir)
    numbers = view.progress_numbers(record, summary)
    progress = render.progress_html(record.state, numbers["step"], numbers["max_steps"],
                                    numbers["progress"], numbers["eta_s"], numbers["elapsed_s"], lang)
    failure = view.failure_text(record, summary, lang)
    util, mem = view.gpu_frames(summary)
    has_gpu = not util.empty or not mem.empty
    actions = job_actions.actions_for(record)
    rewards = reward_view.reward_frame(summary, lang)   # a preference job's margin and accuracy
    return [
        progress,
        render.notice_html(failure, "error" if record.state == "failed" else "warn") if failure else "",
        view.loss_frame(summary, lang),
        view.rss_frame(summary),
        view.cpu_frame(summary),
        gr.update(value=util, visible=has_gpu),
        gr.update(value=mem, visible=has_gpu),
        gr.update(value=rewards, visible=not rewards.empty),
        view.patch_report_text(record, summary, lang),
        render.log_html(tail_log(record.job_dir, lines=LOG_LINES), lang=lang),
        *[gr.update(visible=action in actions) for action in ACTIONS],
    ]


ACTIONS = (job_actions.CANCEL, job_actions.REMOVE, job_actions.DELETE)


def empty_detail(lang: str) -> list[Any]:
    """The detail outputs while no job is picked: a hint, no curves, no actions."""
    return [render.notice_html(t("jobs.pick_hint", lang), "info"), "", None, None, None,
            gr.update(visible=False), gr.update(visible=False), gr.update(visible=False), "", "",
            *[gr.update(visible=False) for _ in ACTIONS]]


DETAIL_LEN = 13


def refresh(ctx: StudioContext, job_id: str | None, table_sig: Any, detail_sig: Any, lang: str = "en",
            pick: bool = False) -> list[Any]:
    """[table, select, *detail(13), table_sig, detail_sig]; unchanged parts are gr.skip().

    `pick` sets the list's value to `job_id` (the user or Start picked it); a poll only updates
    the list's choices, except that a job which no longer exists is unpicked.
    """
    records, table, choices = table_and_choices(ctx, lang)
    by_id = {r.id: r for r in records}
    gone = job_id is not None and job_id not in by_id
    if gone:
        job_id = None
    new_table_sig = (tuple(map(tuple, table.values.tolist())), lang)
    if new_table_sig == table_sig and not (pick or gone):
        table_out, select_out = gr.skip(), gr.skip()
    else:
        table_out = gr.update(value=table)
        select_out = (gr.update(choices=choices, value=job_id) if pick or gone
                      else gr.update(choices=choices))
    record = by_id.get(job_id)
    if record is None:
        new_detail_sig = ("none", lang)
        if new_detail_sig == detail_sig:
            return [table_out, select_out, *[gr.skip()] * DETAIL_LEN, new_table_sig, detail_sig]
        return [table_out, select_out, *empty_detail(lang), new_table_sig, new_detail_sig]
    new_detail_sig = (record.id, record.state, ctx.events.signature(record.job_dir), _log_size(record), lang)
    if new_detail_sig == detail_sig:
        return [table_out, select_out, *[gr.skip()] * DETAIL_LEN, new_table_sig, detail_sig]
    return [table_out, select_out, *detail(ctx, record, lang), new_table_sig, new_detail_sig]


def _log_size(record: Any) -> int:
    try:
        return JobLayout(record.job_dir).log.stat().st_size
    except OSError:
        return -1


def _plots(ctx: StudioContext) -> list[gr.LinePlot]:
    """loss, rss, cpu, gpu util, gpu mem, rewards: axes from zero where a zero means something. The
    rewards chart (a preference job's margin and accuracy) sits beside the loss, hidden for SFT."""
    bind = ctx.page.bind
    with gr.Row():
        loss = bind(gr.LinePlot(x="step", y="loss", color="series", elem_id="ft-loss-plot", height=260),
                    title="plot.loss_title", x_title="plot.step", y_title="plot.loss", color_title="plot.series")
        rewards = bind(gr.LinePlot(x="step", y="value", color="series", elem_id="ft-reward-plot", height=260,
                                   visible=False),
                       title="plot.reward_title", x_title="plot.step", y_title="plot.value",
                       color_title="plot.series")
        rss = bind(gr.LinePlot(x="elapsed_s", y="rss_gb", elem_id="ft-rss-plot", height=260,
                               y_lim=[0, None], y_axis_format=GB_FORMAT),
                   title="plot.rss_title", x_title="plot.seconds", y_title="plot.gb")
        cpu = bind(gr.LinePlot(x="elapsed_s", y="cpu_pct", elem_id="ft-cpu-plot", height=260, y_lim=[0, 100]),
                   title="plot.cpu_title", x_title="plot.seconds", y_title="plot.percent")
    with gr.Row():
        gpu_util = bind(gr.LinePlot(x="elapsed_s", y="util_pct", color="gpu", elem_id="ft-gpu-util", height=240,
                                    visible=False, y_lim=[0, 100]),
                        title="plot.gpu_util_title", x_title="plot.seconds", y_title="plot.percent")
        gpu_mem = bind(gr.LinePlot(x="elapsed_s", y="mem_used_gb", color="gpu", elem_id="ft-gpu-mem", height=240,
                                   visible=False, y_lim=[0, None], y_axis_format=GB_FORMAT),
                       title="plot.gpu_mem_title", x_title="plot.seconds", y_title="plot.gb")
    return [loss, rss, cpu, gpu_util, gpu_mem, rewards]


def build_jobs_tab(ctx: StudioContext) -> JobsTab:
    bind = ctx.page.bind
    table = bind(gr.Dataframe(headers=view.table_headers("en"), interactive=False, elem_id="ft-jobs-table",
                              max_height=260, wrap=True), label="jobs.table_label")
    with gr.Row():
        select = bind(gr.Dropdown(choices=[], value=None, elem_id="ft-job-select", scale=4), label="jobs.job")
        buttons = [bind(gr.Button(variant=variant, elem_id=f"ft-{action}", visible=False, scale=1, min_width=140),
                        value=f"jobs.action_{action}")
                   for action, variant in zip(ACTIONS, ("stop", "secondary", "stop"))]
    with gr.Group(visible=False, elem_id="ft-confirm") as confirm:
        question = gr.HTML(elem_id="ft-confirm-text")
        with gr.Row():
            yes = bind(gr.Button(variant="stop", elem_id="ft-confirm-yes", scale=0, min_width=160), value="confirm.yes")
            no = bind(gr.Button(elem_id="ft-confirm-no", scale=0, min_width=160), value="confirm.no")
    notice = gr.HTML(elem_id="ft-job-action")
    progress = gr.HTML(elem_id="ft-job-progress")
    failure = gr.HTML(elem_id="ft-job-failure")
    plots = _plots(ctx)
    with gr.Row():
        report = bind(gr.Textbox(lines=6, max_lines=20, interactive=False, elem_id="ft-kernel-report"),
                      label="jobs.kernel_report")
        with gr.Column():
            bind(gr.Markdown(), value="jobs.log_title")
            log = gr.HTML(elem_id="ft-log")
    table_sig, detail_sig, pending = gr.State(None), gr.State(None), gr.State(None)
    timer = gr.Timer(POLL_S)
    outputs = [table, select, progress, failure, *plots, report, log, *buttons, table_sig, detail_sig]
    tab = JobsTab(table=table, select=select, timer=timer, refresh_outputs=outputs)
    _wire_view(ctx, tab, table_sig, detail_sig)
    _wire_actions(ctx, tab, buttons, (confirm, question, yes, no, notice, pending))
    return tab


def _wire_view(ctx: StudioContext, tab: JobsTab, table_sig: gr.State, detail_sig: gr.State) -> None:
    lang, outputs = ctx.lang, tab.refresh_outputs

    def on_tick(job_id: str | None, t_sig: Any, d_sig: Any, language: str) -> list[Any]:
        return refresh(ctx, job_id, t_sig, d_sig, language)

    def on_select(job_id: str | None, t_sig: Any, language: str) -> list[Any]:
        return refresh(ctx, job_id, t_sig, None, language, pick=True)

    def on_row(evt: gr.SelectData, language: str) -> list[Any]:
        job_id = evt.row_value[0] if evt.row_value else None
        return refresh(ctx, job_id, None, None, language, pick=True)

    tab.timer.tick(on_tick, [tab.select, table_sig, detail_sig, lang], outputs, show_progress="hidden")
    tab.select.input(on_select, [tab.select, table_sig, lang], outputs, show_progress="hidden")
    tab.table.select(on_row, [lang], outputs, show_progress="hidden")
    lang.change(on_select, [tab.select, table_sig, lang], outputs, show_progress="hidden")


def _wire_actions(ctx: StudioContext, tab: JobsTab, buttons: list[gr.Button], parts: tuple) -> None:
    """Each action button asks first (naming the job); only the answer acts, on the job asked about."""
    confirm, question, yes, no, notice, pending = parts
    lang = ctx.lang

    def asker(action: str):
        def ask(job_id: str | None, language: str) -> list[Any]:
            record = ctx.runner.get(job_id) if job_id else None
            if record is None or action not in job_actions.actions_for(record):
                return [gr.update(visible=False), "", None,
                        render.notice_html(t("action.pick_first", language), "warn")]
            text = job_actions.question(action, record, language)
            return [gr.update(visible=True), render.notice_html(text, "warn"), (action, record.id), ""]
        return ask

    for action, button in zip(ACTIONS, buttons):
        button.click(asker(action), [tab.select, lang], [confirm, question, pending, notice])

    def on_yes(asked: tuple[str, str] | None, language: str) -> list[Any]:
        hidden = [gr.update(visible=False), None]
        if not asked:
            return [*hidden, gr.skip(), *[gr.skip()] * len(tab.refresh_outputs)]
        action, job_id = asked
        level, message = job_actions.perform(ctx.runner, action, job_id, language)
        return [*hidden, render.notice_html(message, level), *refresh(ctx, job_id, None, None, language, pick=True)]

    yes.click(on_yes, [pending, lang], [confirm, pending, notice, *tab.refresh_outputs])
    no.click(lambda: [gr.update(visible=False), None, ""], None, [confirm, pending, notice])
    tab.select.input(lambda: [gr.update(visible=False), None], None, [confirm, pending])
