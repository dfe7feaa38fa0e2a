"""The Jobs tab: every job in a table; the selected one's progress, curves, kernel report and log.

A gr.Timer polls every POLL_S seconds. All state is read from disk (the SQLite store and the job's
events.jsonl / train.log), so a reopened browser shows exactly what the job is doing; the job
never depends on the page. Each poll re-sends only what changed (a per-browser signature).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from jobs.events import tail_log
from studio import jobs_view as view
from studio import render
from studio.context import StudioContext

POLL_S = 1.5
LOG_LINES = 200


@dataclass
class JobsTab:
    table: gr.Dataframe
    select: gr.Dropdown
    timer: gr.Timer
    refresh_outputs: list[Any]  # what refresh() returns values for, in order


def table_and_choices(ctx: StudioContext) -> tuple[list[Any], list[list[str]], list[tuple[str, str]]]:
    records = ctx.runner.list_jobs()
    rows = [view.job_row(r, ctx.events.get(r.job_dir)) for r in records]
    return records, rows, [view.job_choice(r) for r in records]


def detail(ctx: StudioContext, record: Any) -> list[Any]:
    """progress, failure, loss, rss, cpu, gpu util, gpu mem, kernel report, log, cancel button."""
    events = ctx.events.get(record.job_dir)
    numbers = view.progress_numbers(record, events)
    progress = render.progress_html(record.state, numbers["step"], numbers["max_steps"],
                                    numbers["progress"], numbers["eta_s"], numbers["elapsed_s"])
    failure = view.failure_text(record, events)
    util, mem = view.gpu_frames(events)
    has_gpu = not util.empty or not mem.empty
    return [
        progress,
        render.notice_html(failure, "error" if record.state == "failed" else "warn") if failure else "",
        view.loss_frame(events),
        view.rss_frame(events),
        view.cpu_frame(events),
        gr.update(value=util, visible=has_gpu),
        gr.update(value=mem, visible=has_gpu),
        view.patch_report_text(events),
        render.log_html(tail_log(record.job_dir, lines=LOG_LINES)),
        gr.update(interactive=record.active),
    ]


EMPTY_DETAIL = ["", "", None, None, None, gr.update(visible=False), gr.update(visible=False), "", "",
                gr.update(interactive=False)]


def refresh(ctx: StudioContext, job_id: str | None, table_sig: Any, detail_sig: Any) -> list[Any]:
    """[table, select, *detail(10), table_sig, detail_sig]; unchanged parts are gr.skip()."""
    records, rows, choices = table_and_choices(ctx)
    by_id = {r.id: r for r in records}
    if job_id not in by_id:
        job_id = view.default_job_id(records)
    new_table_sig = (tuple(map(tuple, rows)), job_id)
    if new_table_sig == table_sig:
        table_out, select_out = gr.skip(), gr.skip()
    else:
        table_out = gr.update(value=rows or None)
        select_out = gr.update(choices=choices, value=job_id)
    record = by_id.get(job_id)
    if record is None:
        return [table_out, select_out, *EMPTY_DETAIL, new_table_sig, None]
    new_detail_sig = (record.id, record.state, ctx.events.signature(record.job_dir), _log_size(record))
    if new_detail_sig == detail_sig:
        return [table_out, select_out, *[gr.skip()] * len(EMPTY_DETAIL), new_table_sig, detail_sig]
    return [table_out, select_out, *detail(ctx, record), new_table_sig, new_detail_sig]


def _log_size(record: Any) -> int:
    try:
        return (Path(record.job_dir) / "train.log").stat().st_size
    except OSError:
        return -1


def build_jobs_tab(ctx: StudioContext) -> JobsTab:
    table = gr.Dataframe(headers=view.TABLE_HEADERS, interactive=False, elem_id="ft-jobs-table",
                         label="Jobs (newest first) — click a row to open it", max_height=260, wrap=True)
    with gr.Row():
        select = gr.Dropdown(label="Job", choices=[], value=None, elem_id="ft-job-select", scale=4)
        cancel = gr.Button("Cancel job", variant="stop", elem_id="ft-cancel", interactive=False,
                           scale=1, min_width=140)
    progress = gr.HTML(elem_id="ft-job-progress")
    failure = gr.HTML(elem_id="ft-job-failure")
    with gr.Row():
        loss = gr.LinePlot(x="step", y="loss", title="Training loss", elem_id="ft-loss-plot", height=260)
        rss = gr.LinePlot(x="elapsed_s", y="rss_gb", title="CPU RAM of the job (GB)", x_title="seconds",
                          elem_id="ft-rss-plot", height=260)
        cpu = gr.LinePlot(x="elapsed_s", y="cpu_pct", title="Machine CPU (%)", x_title="seconds",
                          elem_id="ft-cpu-plot", height=260)
    with gr.Row():
        gpu_util = gr.LinePlot(x="elapsed_s", y="util_pct", color="gpu", title="GPU utilisation (%)",
                               x_title="seconds", elem_id="ft-gpu-util", height=240, visible=False)
        gpu_mem = gr.LinePlot(x="elapsed_s", y="mem_used_gb", color="gpu", title="GPU memory used (GB)",
                              x_title="seconds", elem_id="ft-gpu-mem", height=240, visible=False)
    with gr.Row():
        report = gr.Textbox(label="Fused kernel report", lines=6, max_lines=20, interactive=False,
                            elem_id="ft-kernel-report")
        with gr.Column():
            gr.Markdown("**train.log** (last lines)")
            log = gr.HTML(elem_id="ft-log")
    table_sig, detail_sig = gr.State(None), gr.State(None)
    timer = gr.Timer(POLL_S)

    outputs = [table, select, progress, failure, loss, rss, cpu, gpu_util, gpu_mem, report, log, cancel,
               table_sig, detail_sig]

    def on_tick(job_id: str | None, t_sig: Any, d_sig: Any) -> list[Any]:
        return refresh(ctx, job_id, t_sig, d_sig)

    def on_select(job_id: str | None, t_sig: Any) -> list[Any]:
        return refresh(ctx, job_id, t_sig, None)

    timer.tick(on_tick, [select, table_sig, detail_sig], outputs, show_progress="hidden")
    select.input(on_select, [select, table_sig], outputs, show_progress="hidden")

    def on_row(evt: gr.SelectData, t_sig: Any) -> list[Any]:
        job_id = evt.row_value[0] if evt.row_value else None
        return refresh(ctx, job_id, None, None)

    table.select(on_row, [table_sig], outputs, show_progress="hidden")

    def on_cancel(job_id: str | None) -> None:
        if job_id:
            ctx.runner.cancel(job_id)
            gr.Info(f"Cancelling {job_id}: it saves the adapter of its current step, then stops.")

    cancel.click(on_cancel, select, None)
    return JobsTab(table=table, select=select, timer=timer, refresh_outputs=outputs)
