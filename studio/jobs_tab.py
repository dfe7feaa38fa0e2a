"""The Jobs tab: every job in a table; the picked one's progress, curves, kernel report, log and
the actions it offers (cancel, remove from the queue, delete, resume / train more steps), each
confirmed first. The action notice is cleared when another job is picked or the job it is about
ends (a "Cancelling job A" must not stay above job B, nor above A once it is cancelled).

The poll's pace (fast while a job runs, slower while idle; a running job's charts at most every
CHART_EVERY_S) is studio/poll_pace.py.
All state is read from disk (the SQLite store and the job's events.jsonl / train.log), so a
reopened browser shows exactly what the job is doing; the job never depends on the page. Each poll
re-sends only what changed (a per-browser signature).

Only the user picks the job shown and acted on (a table row or the list; Start picks the job it
started): a poll never changes the selection, so an action never lands on a job the user did
not choose.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from jobs.io.events import tail_log
from jobs.io.layout import JobLayout
from studio import cluster_view, job_actions
from studio import jobs_view as view
from studio import plots, render, reward_view
from studio.context import StudioContext
from studio.i18n import t
from studio.poll_pace import POLL_S, ShownJob, charts_due, charts_owed, ended, next_poll, shown

CHARTS = slice(2, 8)   # loss, rss, cpu, gpu util, gpu mem, rewards in detail()'s list
SHARED_TTL_S = 0.5   # a poll may show the table and a job this much late; a click reads them afresh
LOG_LINES = 200
GB_FORMAT = ".2~f"  # d3 format: 1.83, not 1.827000 on a flat curve


@dataclass
class JobsTab:
    table: gr.Dataframe
    select: gr.Dropdown
    timer: gr.Timer
    refresh_outputs: list[Any]  # what refresh() returns values for, in order
    table_sig: Any = None       # gr.State: changes when the table does (a job started, stepped or ended)


def table_and_choices(ctx: StudioContext, lang: str) -> tuple[list[Any], pd.DataFrame, list[tuple[str, str]]]:
    records = ctx.runner.list_jobs()
    rows = [view.job_row(r, ctx.events.get(r.job_dir), lang) for r in records]
    table = pd.DataFrame(rows, columns=view.table_headers(lang))
    return records, table, [view.job_choice(r, lang) for r in records]


def detail(ctx: StudioContext, record: Any, lang: str, values: tuple | None = None) -> list[Any]:
    """progress, failure, loss, rss, cpu, gpu util, gpu mem, reward, completions, kernel report, log, the
    action buttons.

    `values` (from `_detail_values`) may be shared by every open page (refresh); the gr.update
    wrappers are made afresh for each answer."""
    if values is None:
        values = _detail_values(ctx, record, lang)
    progress, failure, loss, rss, cpu, util, mem, has_gpu, rewards, completions, report, log, actions = values
    return [progress, failure, loss, rss, cpu,
            gr.update(value=util, visible=has_gpu), gr.update(value=mem, visible=has_gpu),
            gr.update(value=rewards, visible=not rewards.empty),      # preference and grpo jobs' rewards
            gr.update(value=completions, visible=completions is not None),  # grpo: sampled completions
            report, log, *[gr.update(visible=action in actions) for action in ACTIONS]]


def reward_chart(summary: Any, lang: str) -> Any:
    """One rewards chart for every method (step, value, series): a preference job's margin and
    accuracy (studio/reward_view.py), else a grpo job's mean and named rewards (studio/jobs_view.py)."""
    frame = reward_view.reward_frame(summary, lang)
    return frame if not frame.empty else view.reward_frame(summary, lang).rename(columns={"reward": "value"})


def _is_grpo(summary: Any) -> bool:
    return any(isinstance(event.get("reward_mean"), (int, float)) for event in summary.steps[-1:])


def _detail_values(ctx: StudioContext, record: Any, lang: str) -> tuple:
    summary = ctx.events.get(record.job_dir)
    numbers = view.progress_numbers(record, summary)
    progress = render.progress_html(record.state, numbers["step"], numbers["max_steps"],
                                    numbers["progress"], numbers["eta_s"], numbers["elapsed_s"], lang,
                                    phase=numbers["phase"])
    progress += view.outcome_html(summary, lang) + view.lineage_html(record, lang)
    progress += view.tracking_html(record, lang) + cluster_view.files_html(record, lang)
    failure = view.failure_text(record, summary, lang)
    util, mem = view.gpu_frames(summary)
    rewards = reward_chart(summary, lang)
    return (progress,
            render.notice_html(failure, "error" if record.state == "failed" else "warn") if failure else "",
            view.loss_frame(summary, lang),  # its colours follow in a second event (studio/plots.py)
            view.rss_frame(summary), view.cpu_frame(summary),
            util, mem, not util.empty or not mem.empty, rewards,
            view.completions_frame(record.job_dir, lang) if _is_grpo(summary) else None,
            view.patch_report_text(record, summary, lang),
            render.log_html(tail_log(record.job_dir, lines=LOG_LINES), lang=lang),
            tuple(job_actions.actions_for(record)))


ACTIONS = (job_actions.CANCEL, job_actions.REMOVE, job_actions.DELETE, job_actions.START_ANYWAY,
           job_actions.RESUME, job_actions.MORE)


def empty_detail(lang: str) -> list[Any]:
    """The detail outputs while no job is picked: a hint, no curves, no actions."""
    return [render.notice_html(t("jobs.pick_hint", lang), "info"), "", None, None, None,
            gr.update(visible=False), gr.update(visible=False), gr.update(visible=False), gr.update(visible=False),
            "", "", *[gr.update(visible=False) for _ in ACTIONS]]


DETAIL_LEN = 11 + len(ACTIONS)


def refresh(ctx: StudioContext, job_id: str | None, table_sig: Any, detail_sig: Any, lang: str = "en",
            pick: bool = False, shared: bool = False, interval: float | None = None, page: str = "") -> list[Any]:
    """[table, select, *detail(DETAIL_LEN), notice, table_sig, detail_sig, timer]; unchanged parts are
    gr.skip().

    `pick` sets the list's value to `job_id` (the user or Start picked it) and records it as the pick of
    `page` (its Gradio session); a poll only updates the list's choices, except that a job which no
    longer exists is unpicked. `shared`: a poll, whose timer `interval` backs off while the page is
    idle; anything else sets it back to POLL_S.
    """
    generation = ctx.shared.generation   # read first: a change after this makes the poll's reading stale
    out = _refresh(ctx, job_id, table_sig, detail_sig, lang, pick, shared)
    if pick:   # the list's value: `job_id`, or None where that job no longer exists
        ctx.shared.pick(page, out[1]["value"])
    if not shared:
        return [*out, gr.update(value=POLL_S) if interval != POLL_S else gr.skip()]
    if ctx.shared.generation != generation:   # a Start or an action changed the list meanwhile: send nothing
        return [*[gr.skip()] * (len(out) - 2), table_sig, detail_sig, gr.update(value=POLL_S)]
    changed = (out[-2], out[-1]) != (table_sig, detail_sig)
    if not ctx.shared.picked(page, job_id):   # read from the page before a pick's answer: not its job's
        out[1].pop("value", None)   # nor does it unpick the page's job (only its list's choices are new)
        out[2:3 + DETAIL_LEN] = [gr.skip()] * (DETAIL_LEN + 1)   # detail and notice (shared_views.py)
        out[-1] = gr.skip()
    records = ctx.shared.get(("table", lang), lambda: table_and_choices(ctx, lang), SHARED_TTL_S)[0]
    return [*out, next_poll(interval, changed or any(not r.finished for r in records))]


def _refresh(ctx: StudioContext, job_id: str | None, table_sig: Any, detail_sig: Any, lang: str,
             pick: bool, shared: bool) -> list[Any]:
    if shared:   # a poll: every open page shares one reading of the store per SHARED_TTL_S
        records, table, choices = ctx.shared.get(("table", lang), lambda: table_and_choices(ctx, lang), SHARED_TTL_S)
    else:
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
        notice = "" if pick else gr.skip()
        if new_detail_sig == detail_sig:
            return [table_out, select_out, *[gr.skip()] * DETAIL_LEN, notice, new_table_sig, detail_sig]
        return [table_out, select_out, *empty_detail(lang), notice, new_table_sig, new_detail_sig]
    notice = "" if pick or ended(record, detail_sig) else gr.skip()
    if shared:   # one snapshot of the job's detail per SHARED_TTL_S for every page, however fast it steps
        new_detail_sig, values = ctx.shared.get(("detail", record.job_dir, record.state, lang),
                                                lambda: _detail_snapshot(ctx, record, lang), SHARED_TTL_S)
    else:
        new_detail_sig, values = _detail_signature(ctx, record, lang), None
    now = time.monotonic()
    due = not shared or charts_due(detail_sig, new_detail_sig, now)
    if new_detail_sig == shown(detail_sig) and not (due and charts_owed(detail_sig)):
        return [table_out, select_out, *[gr.skip()] * DETAIL_LEN, notice, new_table_sig, detail_sig]
    out = detail(ctx, record, lang, values)
    if due:
        return [table_out, select_out, *out, notice, new_table_sig, ShownJob(new_detail_sig, now, False)]
    out[CHARTS] = [gr.skip()] * len(out[CHARTS])   # the charts follow when due, owed meanwhile
    return [table_out, select_out, *out, notice, new_table_sig, ShownJob(new_detail_sig, detail_sig.charts_at, True)]


def _detail_signature(ctx: StudioContext, record: Any, lang: str) -> tuple:
    return (record.id, record.state, ctx.events.signature(record.job_dir), _log_size(record), lang)


def _detail_snapshot(ctx: StudioContext, record: Any, lang: str) -> tuple[tuple, tuple]:
    """(signature, values), the signature taken first: a change during the reading shows next time."""
    return _detail_signature(ctx, record, lang), _detail_values(ctx, record, lang)


def _log_size(record: Any) -> int:
    try:
        return JobLayout(record.job_dir).log.stat().st_size
    except OSError:
        return -1


def _plots(ctx: StudioContext) -> list[gr.LinePlot]:
    """loss, rss, cpu, gpu util, gpu mem, rewards, completions (grpo): axes from zero where a zero means
    something. The rewards chart (a preference job's margin and accuracy, a grpo job's rewards) sits beside
    the loss, hidden for SFT; the memory and CPU charts take the next row. Four charts in one row left
    the rewards chart, with its legend of four series, ~65 px of plotting width at 1440 px (issue 40)."""
    bind = ctx.page.bind
    with gr.Row():
        loss = bind(gr.LinePlot(x="step", y="loss", color="series", elem_id="ft-loss-plot", height=260,
                                min_width=360),
                    title="plot.loss_title", x_title="plot.step", y_title="plot.loss", color_title="plot.series")
        rewards = bind(gr.LinePlot(x="step", y="value", color="series", elem_id="ft-reward-plot", height=260,
                                   visible=False, min_width=360),
                       title="plot.reward_title", x_title="plot.step", y_title="plot.reward",
                       color_title="plot.series")
    with gr.Row():
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
    # fixed shares of the box's width, wrapped: the reward columns stay on screen however long a completion
    completions = bind(gr.Dataframe(interactive=False, elem_id="ft-completions", visible=False, wrap=True,
                                    max_height=320, column_widths=["7%", "28%", "41%", "8%", "16%"]),
                       label="jobs.completions_label")
    return [loss, rss, cpu, gpu_util, gpu_mem, rewards, completions]


def build_jobs_tab(ctx: StudioContext) -> JobsTab:
    bind = ctx.page.bind
    table = bind(gr.Dataframe(headers=view.table_headers("en"), interactive=False, elem_id="ft-jobs-table",
                              max_height=260, wrap=True), label="jobs.table_label")
    with gr.Row():
        select = bind(gr.Dropdown(choices=[], value=None, elem_id="ft-job-select", scale=4), label="jobs.job")
        buttons = [bind(gr.Button(variant=variant, elem_id=f"ft-{action}", visible=False, scale=1, min_width=140),
                        value=f"jobs.action_{action}")
                   for action, variant in zip(ACTIONS, ("stop", "secondary", "stop", "primary", "primary", "primary"))]
    with gr.Group(visible=False, elem_id="ft-confirm") as confirm:
        question = gr.HTML(elem_id="ft-confirm-text")
        more_steps = bind(gr.Number(value=50, precision=0, minimum=1, visible=False, elem_id="ft-more-steps"),
                          label="jobs.more_steps")
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
    cluster_view.build_cluster_panel(ctx)   # a Ray cluster's nodes and jobs (studio/cluster_view.py)
    table_sig, detail_sig, pending = gr.State(None), gr.State(None), gr.State(None)
    timer = gr.Timer(POLL_S)
    plots_sent = gr.State(None)  # the loss plot's colour map as last sent
    outputs = [table, select, progress, failure, *plots, report, log, *buttons, notice, table_sig, detail_sig,
               timer]
    tab = JobsTab(table=table, select=select, timer=timer, refresh_outputs=outputs, table_sig=table_sig)
    polled = _wire_view(ctx, tab, table_sig, detail_sig)
    _wire_colors(ctx, tab, polled, plots[0], plots_sent)
    _wire_actions(ctx, tab, buttons, (confirm, question, yes, no, notice, pending, more_steps))
    return tab


def _wire_view(ctx: StudioContext, tab: JobsTab, table_sig: gr.State, detail_sig: gr.State) -> Any:
    """The poll and the picks; returns the poll's event (for what must follow each poll)."""
    lang, outputs = ctx.lang, tab.refresh_outputs

    def on_tick(job_id: str | None, t_sig: Any, d_sig: Any, language: str, interval: float | None,
                request: gr.Request) -> list[Any]:
        return refresh(ctx, job_id, t_sig, d_sig, language, shared=True, interval=interval, page=_page(request))

    def on_select(job_id: str | None, t_sig: Any, language: str, request: gr.Request) -> list[Any]:
        return refresh(ctx, job_id, t_sig, None, language, pick=True, page=_page(request))

    def on_row(evt: gr.SelectData, language: str, request: gr.Request) -> list[Any]:
        job_id = evt.row_value[0] if evt.row_value else None
        return refresh(ctx, job_id, None, None, language, pick=True, page=_page(request))

    polled = tab.timer.tick(on_tick, [tab.select, table_sig, detail_sig, lang, tab.timer], outputs,
                            show_progress="hidden")
    tab.select.input(on_select, [tab.select, table_sig, lang], outputs, show_progress="hidden",
                     api_name="job_detail")   # named: bench/page_check.py follows a job through it
    tab.table.select(on_row, [lang], outputs, show_progress="hidden")
    lang.change(on_select, [tab.select, table_sig, lang], outputs, show_progress="hidden")
    return polled


def _page(request: gr.Request | None) -> str:
    """The page's key for its pick (SharedViews.pick): its Gradio session."""
    return (request.session_hash if request is not None else None) or ""


def _wire_colors(ctx: StudioContext, tab: JobsTab, polled: Any, loss_plot: gr.LinePlot, sent: gr.State) -> None:
    """After each poll: tell the loss chart the series it now shows, once they change (a picked
    job, a language, the first eval), so that vega draws them (studio/plots.py)."""
    def on_sync(shown: Any, previous: dict | None) -> list[Any]:
        return list(plots.color_sync(shown, previous))

    polled.then(on_sync, [loss_plot, sent], [loss_plot, sent], show_progress="hidden")


def _wire_actions(ctx: StudioContext, tab: JobsTab, buttons: list[gr.Button], parts: tuple) -> None:
    """Each action button asks first (naming the job); only the answer acts, on the job asked about."""
    confirm, question, yes, no, notice, pending, more_steps = parts
    lang = ctx.lang

    def asker(action: str):
        def ask(job_id: str | None, language: str) -> list[Any]:
            record = ctx.runner.get(job_id) if job_id else None
            if record is None or action not in job_actions.actions_for(record):
                return [gr.update(visible=False), "", None,
                        render.notice_html(t("action.pick_first", language), "warn"), gr.update(visible=False)]
            text = job_actions.question(action, record, language)
            more = (gr.update(visible=True, value=job_actions.default_more_steps(record))
                    if action == job_actions.MORE else gr.update(visible=False))
            return [gr.update(visible=True), render.notice_html(text, "warn"), (action, record.id), "", more]
        return ask

    for action, button in zip(ACTIONS, buttons):
        button.click(asker(action), [tab.select, lang], [confirm, question, pending, notice, more_steps],
                     api_name=f"ask_{action}")

    notice_at = tab.refresh_outputs.index(notice)

    def on_yes(asked: tuple[str, str] | None, steps: float | None, language: str, request: gr.Request) -> list[Any]:
        hidden = [gr.update(visible=False), None]
        if not asked:
            return [*hidden, *[gr.skip()] * len(tab.refresh_outputs)]
        action, job_id = asked
        level, message = job_actions.perform(ctx.runner, action, job_id, language, more_steps=int(steps or 0))
        ctx.shared.invalidate()   # the polls' shared reading predates this action
        out = refresh(ctx, job_id, None, None, language, pick=True, page=_page(request))
        out[notice_at] = render.notice_html(message, level)
        return [*hidden, *out]

    yes.click(on_yes, [pending, more_steps, lang], [confirm, pending, *tab.refresh_outputs], api_name="job_action")
    no.click(lambda: [gr.update(visible=False), None, ""], None, [confirm, pending, notice])
    tab.select.input(lambda: [gr.update(visible=False), None], None, [confirm, pending])
