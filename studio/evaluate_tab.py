"""The Evaluate tab (LlamaBoard's "Evaluate & Predict" for Fusetune): a finished job's base and tuned
models answer the same rows, scored side by side, with the difference and its confidence interval, a
per-row view sorted by the change, and the files to download.

The page checks the form as an EvalConfig (a refusal names the field at once) and queues it in the
studio's job queue (`Runner.submit_evaluation`, jobs/queue/evaluations.py): the runner starts
`python -m jobs.evaluate` on the GPU it places it on, after any job that holds that GPU, as it starts a
training job. Meanwhile the page shows why it waits, then the progress read from the evaluation's
events.jsonl. Cancel is the queue's cancel (queued: it never starts; running: SIGTERM, the CLI keeps
the rows done). An evaluation outlives the page that queued it, as a job does."""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
import pandas as pd

from jobs.evaluate import report
from jobs.evaluate.config import EvalConfig
from jobs.evaluate.harness import bundled_tasks
from jobs.io.events import read_events
from jobs.io.layout import EvalLayout
from jobs.queue.store import JobState
from jobs.spec import SpecError
from studio import jobs_view as view
from studio import render
from studio.context import PICKER_REFRESH, StudioContext
from studio.i18n import t
from studio.server_text import translated

POLL_S = 0.5
ROWS_SHOWN = 500
EVAL_FILE_TYPES = (".jsonl", ".json", ".csv", ".parquet")


class PageEvaluations:
    """The evaluation each page (by Gradio session) is following, so that its Cancel stops its own."""

    def __init__(self):
        self._following: dict[str, str] = {}
        self._lock = threading.Lock()

    def follow(self, key: str, evaluation_id: str) -> None:
        with self._lock:
            self._following[key] = evaluation_id

    def done(self, key: str, evaluation_id: str) -> None:
        with self._lock:
            if self._following.get(key) == evaluation_id:
                del self._following[key]

    def cancel(self, ctx: StudioContext, key: str) -> bool:
        """Cancel the page's evaluation, waiting or running; False when it follows none."""
        with self._lock:
            evaluation_id = self._following.get(key)
        return evaluation_id is not None and ctx.runner.cancel(evaluation_id)


def eval_config(job_dir: str, eval_file: str | None, max_new_tokens: int, limit: int, benchmark: bool) -> dict:
    """The form as an EvalConfig mapping (jobs/evaluate/config.py), named by the time it starts."""
    # str(): Gradio hands an upload's path as a str subclass, which YAML cannot write
    return {"job": str(job_dir), "eval_file": str(eval_file or ""), "name": time.strftime("page-%Y%m%d-%H%M%S"),
            "max_new_tokens": int(max_new_tokens), "limit": int(limit),
            "tasks": sorted(bundled_tasks()) if benchmark else []}


def queue_evaluation(ctx: StudioContext, job_id: str | None, eval_file: str | None, max_new_tokens: int,
                     limit: int, benchmark: bool, lang: str) -> tuple[str | None, str]:
    """(the queued evaluation's id, "") or (None, the refusal as status HTML): checked here, before the
    queue, so a bad field is named at once."""
    record = ctx.runner.get(job_id) if job_id else None
    if record is None:
        return None, render.notice_html(t("evaluate.pick_job", lang), "warn")
    try:
        config = EvalConfig.from_dict(eval_config(record.job_dir, eval_file, max_new_tokens, limit, benchmark))
        return ctx.runner.submit_evaluation(record.id, dataclasses.asdict(config)).id, ""
    except (SpecError, OSError, RuntimeError) as exc:   # RunnerError, a StorageError: one line each
        return None, render.notice_html(t("evaluate.failed", lang, error=translated(str(exc), lang)), "error")


def follow_evaluation(ctx: StudioContext, evaluation_id: str, on_progress: Callable[[float, str], None],
                      lang: str) -> Iterator[str]:
    """The status HTML each time it changes while the evaluation waits or runs (why it waits, then
    its progress on `on_progress`); returns once it has ended."""
    shown = None
    while (record := ctx.runner.get(evaluation_id)) is not None and not record.finished:
        if record.state == JobState.QUEUED:
            reason = translated(record.reason, lang) or t("evaluate.queued", lang)
            status, level = t("evaluate.waiting", lang, reason=reason), "warn"
            on_progress(0.0, status)
        else:
            status, level = t("evaluate.running", lang), "info"
            _report(Path(record.job_dir), on_progress)
        if status != shown:
            shown = status
            yield render.notice_html(status, level)
        time.sleep(POLL_S)


def _report(folder: Path, on_progress) -> None:
    phases = [e for e in read_events(folder) if e.get("type") == "phase"]
    if phases:
        last = phases[-1]
        done, total = last.get("done") or 0, last.get("total") or 0
        on_progress(done / total if total else 0.0, f"{last['phase']} {done}/{total}" if total else last["phase"])


def ended_view(ctx: StudioContext, evaluation_id: str, lang: str) -> tuple[str, pd.DataFrame, pd.DataFrame, list[str]]:
    """(status HTML, results table, rows table, files) of an evaluation that has ended."""
    record = ctx.runner.get(evaluation_id)
    empty = results_frame(None), rows_frame(None), []
    if record is None:
        return (render.notice_html(t("evaluate.failed", lang, error=evaluation_id), "error"), *empty)
    layout = EvalLayout(record.job_dir)
    if record.state == JobState.DONE:
        status = render.notice_html(t("evaluate.done", lang, folder=str(layout.root)), "ok")
    elif record.state == JobState.CANCELLED:
        kept = layout.results.is_file()   # stopped while running: the rows done so far, with their table
        status = render.notice_html(t("evaluate.cancelled", lang, folder=str(layout.root)) if kept
                                    else t("evaluate.cancelled_waiting", lang), "warn")
    else:
        return (render.notice_html(t("evaluate.failed", lang, error=translated(record.reason, lang)), "error"),
                *empty)
    return status, results_frame(layout), rows_frame(layout), downloads(layout)


def results_frame(layout: EvalLayout | None) -> pd.DataFrame:
    """The base-vs-tuned table: metric, rows, base, tuned, difference, 95% interval."""
    columns = ["metric", "rows", "base", "tuned", "difference", "95% CI"]
    results = report.read_results(layout) if layout is not None else None
    if results is None:
        return pd.DataFrame(columns=columns)
    rows = [[e["metric"], e["rows"], round(e["base"], 3), round(e["tuned"], 3), round(e["difference"], 3),
             f"[{e['ci_low']:+.3f}, {e['ci_high']:+.3f}]"] for e in results["table"]]
    for task, metrics in (results.get("benchmarks") or {}).items():
        rows += [[f"{task}/{metric}", "", round(v["base"], 3), round(v["tuned"], 3), round(v["difference"], 3), ""]
                 for metric, v in metrics.items()]
    return pd.DataFrame(rows, columns=columns)


def rows_frame(layout: EvalLayout | None) -> pd.DataFrame:
    """Per row: prompt, reference, both answers and the change of the first metric, the biggest
    gain first (the column headers sort it the other way)."""
    records = report.read_rows(layout) if layout is not None else []
    metric = next((m for r in records for m in r["change"]), "")
    rows = [[r["row"], report.prompt_text(r["prompt"])[-300:], r.get("reference") or "", r.get("base") or "",
             r.get("tuned") or "", r["change"].get(metric)] for r in records]
    frame = pd.DataFrame(rows, columns=["row", "prompt", "reference", "base", "tuned", f"change {metric}".strip()])
    return frame.sort_values(frame.columns[-1], ascending=False, na_position="last").head(ROWS_SHOWN)


def downloads(layout: EvalLayout) -> list[str]:
    return [str(p) for p in (layout.results, layout.rows, layout.rows_csv, layout.benchmarks) if p.is_file()]


def evaluate(ctx: StudioContext, job_id: str | None, eval_file: str | None, max_new_tokens: int, limit: int,
             benchmark: bool, on_progress, lang: str, pages: PageEvaluations, key: str = "") -> Iterator[tuple]:
    """The page's outputs (status HTML, results table, rows table, files) while one evaluation of the
    picked job is queued, waits, runs and ends: the last are its results."""
    evaluation_id, refusal = queue_evaluation(ctx, job_id, eval_file, max_new_tokens, limit, benchmark, lang)
    if evaluation_id is None:
        yield refusal, results_frame(None), rows_frame(None), []
        return
    pages.follow(key, evaluation_id)
    try:
        for status in follow_evaluation(ctx, evaluation_id, on_progress, lang):
            yield status, gr.update(), gr.update(), gr.update()
    finally:
        pages.done(key, evaluation_id)
    yield ended_view(ctx, evaluation_id, lang)


def evaluable_choices(ctx: StudioContext, lang: str = "en") -> list[tuple[str, str]]:
    return [view.job_choice(r, lang) for r in ctx.runner.list_jobs() if view.exportable(r)]


def evaluate_choices_update(ctx: StudioContext, picked: str | None, lang: str = "en") -> Any:
    """The job dropdown's update: the evaluable jobs, the current pick kept, else the newest."""
    choices = evaluable_choices(ctx, lang)
    values = [value for _, value in choices]
    return gr.update(choices=choices, value=picked if picked in values else (values[0] if values else None))


def chosen_file_html(path: str | None, lang: str) -> str:
    """The note beside the upload button: the chosen file's name, or nothing (the held-out data)."""
    return render.notice_html(t("evaluate.chosen", lang, name=Path(path).name), "info") if path else ""


def _build_eval_file(ctx: StudioContext) -> gr.UploadButton:
    """The eval rows: an upload button (as the Train tab's dataset upload) with the chosen file's name
    beside it, and a button back to the job's held-out data. Returns the upload button: its value is
    the chosen file (None: the held-out data), an input of Evaluate.

    An UploadButton, not a gr.File: Playwright's file choice into a gr.File sometimes started an
    upload that never ended on a loaded 2-core machine (suspected Gradio's upload / upload_progress
    race, gradio PR 11102); the Train tab's UploadButton never did."""
    bind = ctx.page.bind
    bind(gr.Markdown(), value="evaluate.eval_file")
    with gr.Row():
        upload = bind(gr.UploadButton(file_types=list(EVAL_FILE_TYPES), size="sm", scale=0, min_width=160,
                                      elem_id="ft-eval-upload"), label="evaluate.upload")
        clear = bind(gr.Button(size="sm", scale=0, min_width=120, elem_id="ft-eval-clear"), value="evaluate.clear")
        shown = gr.HTML(elem_id="ft-eval-file")
    upload.upload(chosen_file_html, [upload, ctx.lang], shown, show_progress="hidden")
    clear.click(lambda: (None, ""), None, [upload, shown], show_progress="hidden")
    return upload


def build_evaluate_tab(ctx: StudioContext) -> gr.Dropdown:
    bind = ctx.page.bind
    bind(gr.Markdown(), value="evaluate.intro")
    with gr.Row():
        select = bind(gr.Dropdown(choices=[], value=None, elem_id="ft-eval-select", scale=4), label="evaluate.job")
        refresh_btn = bind(gr.Button(size="sm", scale=0, min_width=120, elem_id="ft-eval-refresh"),
                           value="evaluate.refresh")
    with gr.Row(equal_height=True):
        with gr.Column(scale=3):
            eval_file = _build_eval_file(ctx)
        max_new = bind(gr.Number(value=64, precision=0, minimum=1, maximum=8192, elem_id="ft-eval-max-new"),
                       label="evaluate.max_new_tokens")
        limit = bind(gr.Number(value=200, precision=0, minimum=0, elem_id="ft-eval-limit"), label="evaluate.limit")
        benchmark = bind(gr.Checkbox(value=False, elem_id="ft-eval-benchmark"), label="evaluate.benchmark")
    with gr.Row():
        run = bind(gr.Button(variant="primary", elem_id="ft-eval-run", scale=0, min_width=140), value="evaluate.run")
        cancel = bind(gr.Button(variant="stop", elem_id="ft-eval-cancel", scale=0, min_width=140),
                      value="evaluate.cancel")
    status = gr.HTML(elem_id="ft-eval-status")
    table = bind(gr.Dataframe(interactive=False, elem_id="ft-eval-table"), label="evaluate.table")
    rows = bind(gr.Dataframe(interactive=False, wrap=True, elem_id="ft-eval-rows"), label="evaluate.rows")
    files = bind(gr.File(file_count="multiple", interactive=False, elem_id="ft-eval-files"), label="evaluate.files")
    pages = PageEvaluations()

    def on_run(job_id, path, max_new_tokens, row_limit, bench, language, request: gr.Request,
               progress: gr.Progress = gr.Progress()) -> Iterator[tuple[Any, ...]]:
        yield from evaluate(ctx, job_id, path, max_new_tokens or 64, row_limit or 0, bench,
                            lambda fraction, message: progress(fraction, desc=message), language, pages,
                            request.session_hash or "")

    run.click(on_run, [select, eval_file, max_new, limit, benchmark, ctx.lang], [status, table, rows, files],
              api_name="evaluate")

    def on_cancel(request: gr.Request) -> None:
        pages.cancel(ctx, request.session_hash or "")

    cancel.click(on_cancel, None, None, api_name="evaluate_cancel", show_progress="hidden")
    refresh_btn.click(lambda picked, language: evaluate_choices_update(ctx, picked, language), [select, ctx.lang],
                      select, **PICKER_REFRESH)
    return select
