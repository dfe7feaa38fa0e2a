"""The Evaluate tab (LlamaBoard's "Evaluate & Predict" for Fusetune): a finished job's base and tuned
models answer the same rows, scored side by side, with the difference and its confidence interval, a
per-row view sorted by the change, and the files to download.

The page writes the form as an EvalConfig YAML and runs `python -m jobs.evaluate` on it in a
subprocess (exactly the CLI, as the Export tab runs the export CLI), reading the evaluation's
events.jsonl for the progress bar. Cancel sends its process group SIGTERM: the CLI keeps the rows done.
It does not go through the job queue yet (jobs/queue/ knows training jobs only)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
import pandas as pd
import yaml

from jobs.evaluate import report
from jobs.evaluate.harness import bundled_tasks
from jobs.io.events import read_events
from jobs.io.layout import EvalLayout, JobLayout
from studio import jobs_view as view
from studio import render
from studio.context import StudioContext
from studio.i18n import t
from studio.server_text import translated

ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 60.0   # a batch in progress finishes or is dropped within this (as the runner's cancel grace)
ROWS_SHOWN = 500


class EvalRuns:
    """The evaluations running now, by page key (one per page), so that Cancel can stop its own."""

    def __init__(self):
        self._running: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def start(self, key: str, command: list[str]) -> subprocess.Popen:
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        with self._lock:
            self._running[key] = proc
        return proc

    def done(self, key: str, proc: subprocess.Popen) -> None:
        with self._lock:
            if self._running.get(key) is proc:
                del self._running[key]

    def cancel(self, key: str) -> bool:
        with self._lock:
            proc = self._running.get(key)
        if proc is None or proc.poll() is not None:
            return False
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
        return True


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def eval_config(job_dir: str, eval_file: str | None, max_new_tokens: int, limit: int, benchmark: bool) -> dict:
    """The form as an EvalConfig mapping (jobs/evaluate/config.py), named by the time it starts."""
    # str(): Gradio hands an upload's path as a str subclass, which YAML cannot write
    return {"job": str(job_dir), "eval_file": str(eval_file or ""), "name": time.strftime("page-%Y%m%d-%H%M%S"),
            "max_new_tokens": int(max_new_tokens), "limit": int(limit),
            "tasks": sorted(bundled_tasks()) if benchmark else []}


def run_evaluation(ctx: StudioContext, config: dict, on_progress: Callable[[float, str], None],
                   runs: EvalRuns, key: str) -> tuple[int, str]:
    """(exit code, its error line) of `python -m jobs.evaluate` on `config`, reporting progress."""
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="evaluate-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        yaml.safe_dump(config, fh)
    folder = JobLayout(config["job"]).evaluation(config["name"]).root
    proc = runs.start(key, [sys.executable, "-m", "jobs.evaluate", path, "--data-dir", str(ctx.data_dir)])
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            _report(folder, on_progress)
            time.sleep(0.5)
    finally:
        runs.done(key, proc)
        reader.join(timeout=5)
        Path(path).unlink(missing_ok=True)
    line = next((e[len("error: "):].strip() for e in reversed(errors) if e.startswith("error: ")), "")
    return proc.returncode, line or " | ".join(e.strip() for e in errors[-3:])


def _report(folder: Path, on_progress) -> None:
    phases = [e for e in read_events(folder) if e.get("type") == "phase"]
    if phases:
        last = phases[-1]
        done, total = last.get("done") or 0, last.get("total") or 0
        on_progress(done / total if total else 0.0, f"{last['phase']} {done}/{total}" if total else last["phase"])


def results_frame(layout: EvalLayout | None) -> pd.DataFrame:
    """The base-vs-tuned table: metric, rows, base, tuned, difference, 95% interval."""
    columns = ["metric", "rows", "base", "tuned", "difference", "95% CI"]
    if layout is None or not layout.results.is_file():
        return pd.DataFrame(columns=columns)
    results = json.loads(layout.results.read_text(encoding="utf-8"))
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


def start_evaluation(ctx: StudioContext, job_id: str | None, eval_file: str | None, max_new_tokens: int,
                     limit: int, benchmark: bool, on_progress, lang: str, runs: EvalRuns, key: str = ""):
    """(status HTML, results table, rows table, files) after one evaluation of the picked job."""
    record = ctx.runner.get(job_id) if job_id else None
    empty = results_frame(None), rows_frame(None), []
    if record is None:
        return (render.notice_html(t("evaluate.pick_job", lang), "warn"), *empty)
    config = eval_config(record.job_dir, eval_file, max_new_tokens, limit, benchmark)
    code, error = run_evaluation(ctx, config, on_progress, runs, key)
    layout = JobLayout(record.job_dir).evaluation(config["name"])
    if code not in (0, 130):
        return (render.notice_html(t("evaluate.failed", lang, error=translated(error, lang)), "error"), *empty)
    status = t("evaluate.cancelled" if code == 130 else "evaluate.done", lang, folder=str(layout.root))
    return (render.notice_html(status, "warn" if code == 130 else "ok"), results_frame(layout), rows_frame(layout),
            downloads(layout))


def evaluable_choices(ctx: StudioContext, lang: str = "en") -> list[tuple[str, str]]:
    return [view.job_choice(r, lang) for r in ctx.runner.list_jobs() if view.exportable(r)]


def evaluate_choices_update(ctx: StudioContext, picked: str | None, lang: str = "en") -> Any:
    """The job dropdown's update: the evaluable jobs, the current pick kept, else the newest."""
    choices = evaluable_choices(ctx, lang)
    values = [value for _, value in choices]
    return gr.update(choices=choices, value=picked if picked in values else (values[0] if values else None))


def build_evaluate_tab(ctx: StudioContext) -> gr.Dropdown:
    bind = ctx.page.bind
    bind(gr.Markdown(), value="evaluate.intro")
    with gr.Row():
        select = bind(gr.Dropdown(choices=[], value=None, elem_id="ft-eval-select", scale=4), label="evaluate.job")
        refresh_btn = bind(gr.Button(size="sm", scale=0, min_width=120, elem_id="ft-eval-refresh"),
                           value="evaluate.refresh")
    with gr.Row(equal_height=True):
        eval_file = bind(gr.File(file_types=[".jsonl", ".json", ".csv", ".parquet"], type="filepath",
                                 elem_id="ft-eval-file", scale=3), label="evaluate.eval_file")
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
    runs = EvalRuns()

    def on_run(job_id, path, max_new_tokens, row_limit, bench, language, request: gr.Request,
               progress: gr.Progress = gr.Progress()) -> Iterator[tuple[Any, ...]]:
        yield render.notice_html(t("evaluate.running", language), "info"), gr.update(), gr.update(), gr.update()
        yield start_evaluation(ctx, job_id, path, max_new_tokens or 64, row_limit or 0, bench,
                               lambda fraction, message: progress(fraction, desc=message), language, runs,
                               request.session_hash or "")

    run.click(on_run, [select, eval_file, max_new, limit, benchmark, ctx.lang], [status, table, rows, files],
              api_name="evaluate")
    def on_cancel(request: gr.Request) -> None:
        runs.cancel(request.session_hash or "")

    cancel.click(on_cancel, None, None, api_name="evaluate_cancel", show_progress="hidden")
    refresh_btn.click(lambda picked, language: evaluate_choices_update(ctx, picked, language), [select, ctx.lang],
                      select)
    return select
