"""Pure views of jobs for the Jobs and Compare tabs: table rows, plot frames, report and failure text.

Inputs are JobRecords (jobs.queue.store) and JobSummaries (jobs.io.events: the one reader of events.jsonl,
schema in docs/contracts.md); outputs are plain lists / pandas DataFrames that Gradio components
take as values, with their text in the page's language.
"""
from __future__ import annotations

import datetime as dt
import html
import json
import os
import threading
import time
from typing import Any, Callable

import pandas as pd

from jobs.io.events import EventTail, JobSummary, read_events, summarize_events
from jobs.io.layout import JobLayout
from jobs.queue.outcome import FINISHED_BEFORE_CANCEL
from jobs.queue.resume import continued_from
from jobs.queue.store import JobState
from studio.i18n import t
from studio.server_text import report_line, translated
from studio.thin import thin

def table_headers(lang: str) -> list[str]:
    return [t("jobs.col_id", lang), t("jobs.col_name", lang), t("jobs.col_state", lang),
            t("jobs.col_step", lang), t("jobs.col_loss", lang), t("jobs.col_created", lang)]


def state_text(state: Any, lang: str) -> str:
    return t(f"state.{JobState(state).value}", lang)


def format_time(epoch: float | None) -> str:
    if not epoch:
        return ""
    return dt.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")


def format_loss(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else ""


def job_row(record: Any, summary: JobSummary, lang: str = "en") -> list[str]:
    """One table row: id, name, state, step/max, last loss (final loss once done), created."""
    last = summary.last_step or {}
    done = summary.final if summary.final and summary.final.get("type") == "done" else {}
    max_steps = last.get("max_steps") or (record.spec or {}).get("max_steps") or ""
    step = f"{last.get('step', 0)}/{max_steps}" if max_steps else str(last.get("step", 0))
    loss = done.get("final_loss", last.get("loss"))
    return [record.id, record.name, state_text(record.state, lang), step, format_loss(loss),
            format_time(record.created_at)]


def job_choice(record: Any, lang: str = "en") -> tuple[str, str]:
    """(label, value) for a job dropdown."""
    return f"{record.id} · {record.name} · {state_text(record.state, lang)}", record.id


def chart_frame(rows: list[dict[str, Any]], dtypes: dict[str, str]) -> pd.DataFrame:
    """A chart's DataFrame (columns x, y[, series]), each series cut to what a chart shows
    (studio/thin.py), with fixed column dtypes even when empty: LinePlot treats an object (empty)
    column as categories, which would give a category axis for the whole job."""
    x, y, *series = list(dtypes)
    return pd.DataFrame(thin(rows, x, y, series[0] if series else None), columns=list(dtypes)).astype(dtypes)


LOSS_COLUMNS = {"step": "int64", "loss": "float64", "series": "string"}


def loss_points(summary: JobSummary) -> tuple[dict[int, float], dict[int, float]]:
    """({step: training loss}, {step: eval loss}); a step seen twice (a resumed job) keeps its
    latest value, a null loss (non-finite, written as null) is left out."""
    train = {int(e["step"]): float(e["loss"]) for e in summary.steps
             if isinstance(e.get("loss"), (int, float)) and "step" in e}
    evals = {int(e["step"]): float(e["eval_loss"]) for e in summary.evals
             if isinstance(e.get("eval_loss"), (int, float)) and "step" in e}
    return train, evals


def loss_frame(summary: JobSummary, lang: str = "en") -> pd.DataFrame:
    """Training loss per step, plus eval loss as its own series when the job evaluates."""
    train, evals = loss_points(summary)
    rows = [{"step": s, "loss": v, "series": t("plot.train_loss", lang)} for s, v in sorted(train.items())]
    rows += [{"step": s, "loss": v, "series": t("plot.eval_loss", lang)} for s, v in sorted(evals.items())]
    return chart_frame(rows, LOSS_COLUMNS)


def gpu_frames(summary: JobSummary) -> tuple[pd.DataFrame, pd.DataFrame]:
    """GPU utilisation (%) and memory (GB) over elapsed seconds, one series per GPU."""
    util, mem = [], []
    for event in summary.steps:
        for gpu in event.get("gpus") or []:
            series = f"GPU {gpu.get('index', 0)}"
            elapsed = float(event.get("elapsed_s", event.get("step", 0)))
            if isinstance(gpu.get("util_pct"), (int, float)):
                util.append({"elapsed_s": elapsed, "util_pct": float(gpu["util_pct"]), "gpu": series})
            if isinstance(gpu.get("mem_used_gb"), (int, float)):
                mem.append({"elapsed_s": elapsed, "mem_used_gb": round(float(gpu["mem_used_gb"]), 2),
                            "gpu": series})
    return (chart_frame(util, {"elapsed_s": "float64", "util_pct": "float64", "gpu": "string"}),
            chart_frame(mem, {"elapsed_s": "float64", "mem_used_gb": "float64", "gpu": "string"}))


def rss_frame(summary: JobSummary) -> pd.DataFrame:
    """The job's RAM in GB, rounded to what a person reads (1.83, not 1.827000)."""
    rows = [{"elapsed_s": float(e.get("elapsed_s", 0.0)), "rss_gb": round(float(e["rss_gb"]), 2)}
            for e in summary.steps if isinstance(e.get("rss_gb"), (int, float))]
    return chart_frame(rows, {"elapsed_s": "float64", "rss_gb": "float64"})


def cpu_frame(summary: JobSummary) -> pd.DataFrame:
    """Machine CPU utilisation (%) over elapsed seconds (psutil, sampled at each step)."""
    rows = [{"elapsed_s": float(e.get("elapsed_s", 0.0)), "cpu_pct": round(float(e["cpu_pct"]), 1)}
            for e in summary.steps if isinstance(e.get("cpu_pct"), (int, float))]
    return chart_frame(rows, {"elapsed_s": "float64", "cpu_pct": "float64"})


def patch_report_text(record: Any, summary: JobSummary, lang: str = "en") -> str:
    """The fused-kernel report of the job's start event, or why there is none yet."""
    start = summary.start
    if not start:
        state = JobState(record.state)
        if state == JobState.QUEUED:
            return t("report.queued", lang)
        if state == JobState.RUNNING:
            return t("report.loading", lang)
        return t("report.ended_before_start", lang, state=state_text(state, lang))
    lines = [t("report.device", lang, device=start["device"])] if start.get("device") else []
    report = start.get("patch_report") or []
    lines += [report_line(str(line), lang) for line in report] if report else [t("report.engine_off", lang)]
    return "\n".join(lines)


def tracking_html(record: Any, lang: str = "en") -> str:
    """The command that opens TensorBoard on a job that reports to it (report_to), else ""."""
    from jobs.io.tracking import tensorboard_command
    report_to = (record.spec or {}).get("report_to") or "none"
    if "tensorboard" not in (report_to if isinstance(report_to, list) else [report_to]):
        return ""
    command = html.escape(tensorboard_command(record.job_dir))
    return (f'<div class="ft-tracking">{html.escape(t("jobs.tensorboard", lang))} '
            f'<code>{command}</code></div>')


def outcome_html(summary: JobSummary, lang: str = "en") -> str:
    """A done job's headline loss: the mean of its last steps (one step's loss is noisy), said so,
    with its last eval loss beside it; "" before the end or for GRPO (its reward tells more)."""
    done = summary.final if summary.final and summary.final.get("type") == "done" else {}
    loss, averaged = done.get("final_loss"), done.get("final_loss_steps")
    if not isinstance(loss, (int, float)) or "reward_mean" in (summary.last_step or {}):
        return ""
    text = t("jobs.final_loss", lang, loss=format_loss(loss), steps=averaged or 1)
    if isinstance(done.get("eval_loss"), (int, float)):
        text += t("jobs.eval_loss_beside", lang, loss=format_loss(done["eval_loss"]))
    return f'<div class="ft-outcome" id="ft-final-loss">{html.escape(text)}</div>' + identity_heldout_html(done, lang)


def identity_heldout_html(done: dict, lang: str = "en") -> str:
    """An identity job's held-out check (jobs/train/identity_eval.py): the name as a serving stack
    that loads the adapter with the base's tokenizer gets it, and the general answers kept; else ""."""
    result = done.get("identity_heldout")
    if not isinstance(result, dict):
        return ""
    total, with_system = result.get("identity_total"), result.get("identity_with_system")
    system = "" if with_system is None else t("jobs.identity_heldout_system", lang, count=with_system, total=total)
    text = t("jobs.identity_heldout", lang, identity=result.get("identity"), total=total, system=system,
             general=result.get("general"), general_total=result.get("general_total"))
    return f'<div class="ft-outcome" id="ft-identity-heldout">{html.escape(text)}</div>'


def lineage_html(record: Any, lang: str = "en") -> str:
    """For a "train more steps" job: which job it continues, and from which step, else ""."""
    link = continued_from(record.job_dir)
    if link is None:
        return ""
    text = t("jobs.continues", lang, job=str(link.get("job_id", "")), name=str(link.get("name", "")),
             step=link["step"])
    return f'<div class="ft-lineage">{html.escape(text)}</div>'


def failure_text(record: Any, summary: JobSummary, lang: str = "en") -> str:
    """Why a job failed or was cancelled, from the error event and the store's reason."""
    state = JobState(record.state)
    if state == JobState.DONE and record.reason == FINISHED_BEFORE_CANCEL:  # cancelled at 98/100, yet done
        return t("failure.done_before_cancel", lang, job=record.id)
    if state not in (JobState.FAILED, JobState.CANCELLED):
        return ""
    error = summary.final if summary.final and summary.final.get("type") == "error" else {}
    parts = []
    if error.get("message"):
        kind = f" ({error['kind']})" if error.get("kind") else ""
        parts.append(f"{translated(error['message'], lang)}{kind}")
    if record.reason and record.reason != error.get("message"):
        parts.append(translated(record.reason, lang))
    reason = " — ".join(parts) if parts else t("failure.no_reason", lang)
    return t("failure.failed" if state == JobState.FAILED else "failure.cancelled", lang,
             job=record.id, reason=reason)


def progress_numbers(record: Any, summary: JobSummary, now: float | None = None) -> dict[str, Any]:
    """step, max_steps, progress (0..1), eta_s from the last step event; elapsed_s since the job
    started (the queue's claim, right after Start: data preparation and model loading count too);
    phase: what a running job does before its first step (a jobs.io.phases event), else None."""
    last = summary.last_step or {}
    step, max_steps = last.get("step", 0), last.get("max_steps") or (record.spec or {}).get("max_steps")
    progress = (step / max_steps) if max_steps else 0.0
    running = JobState(record.state) == JobState.RUNNING
    return {"step": step, "max_steps": max_steps, "progress": progress,
            "eta_s": last.get("eta_s"), "elapsed_s": elapsed_since_start(record, last, now),
            "phase": summary.phase if running else None}


def elapsed_since_start(record: Any, last: dict[str, Any], now: float | None = None) -> float | None:
    started, state = getattr(record, "started_at", None), JobState(record.state)
    if not started or state == JobState.QUEUED:
        return last.get("elapsed_s")
    end = record.finished_at if state.finished and record.finished_at else (now or time.time())
    return max(0.0, end - started)


def has_adapter(record: Any) -> bool:
    return JobLayout(record.job_dir).has_adapter()


def exportable(record: Any) -> bool:
    """Finished jobs, and cancelled ones that saved an adapter before stopping."""
    return record.state in (JobState.DONE, JobState.CANCELLED) and has_adapter(record)


class EventCache:
    """The JobSummary of each job dir, re-read only when events.jsonl changed (size or mtime).

    The Jobs tab refreshes every ~1.5 s for every open browser; this keeps that to a stat call
    per job when nothing moved.
    """

    def __init__(self, reader: Callable[[str], list[dict[str, Any]]] = read_events):
        self._reader = reader
        self._entries: dict[str, tuple[tuple[int, int], JobSummary]] = {}
        self._tails: dict[str, EventTail] = {}   # the default reader: only appended bytes are read
        self._lock = threading.Lock()

    def get(self, job_dir: str) -> JobSummary:
        key = self.signature(job_dir)
        if key is None:
            return JobSummary()
        with self._lock:
            cached = self._entries.get(job_dir)
            if cached and cached[0] == key:
                return cached[1]
            if self._reader is read_events:
                summary = self._tails.setdefault(job_dir, EventTail(job_dir)).read()
                self._entries[job_dir] = (key, summary)
                return summary
        summary = summarize_events(self._reader(job_dir))
        with self._lock:
            self._entries[job_dir] = (key, summary)
        return summary

    @staticmethod
    def signature(job_dir: str) -> tuple[int, int] | None:
        """(size, mtime) of events.jsonl, or None while the job has written none."""
        try:
            stat = os.stat(JobLayout(job_dir).events)
        except OSError:
            return None
        return (stat.st_size, stat.st_mtime_ns)


REWARD_COLUMNS = {"step": "int64", "reward": "float64", "series": "string"}
COMPLETIONS_SHOWN = 8


def reward_frame(summary: JobSummary, lang: str = "en") -> pd.DataFrame:
    """grpo: the mean reward per step, and each named reward (reward/<name>) as its own series."""
    rows = []
    for event in summary.steps:
        if not isinstance(event.get("reward_mean"), (int, float)):
            continue
        rows.append({"step": int(event["step"]), "reward": float(event["reward_mean"]),
                     "series": t("plot.reward_mean", lang)})
        rows += [{"step": int(event["step"]), "reward": float(v), "series": k.removeprefix("reward/")}
                 for k, v in event.items() if k.startswith("reward/") and isinstance(v, (int, float))]
    return chart_frame(rows, REWARD_COLUMNS)


PROMPT_SHOWN = 160   # characters of a prompt's end: the question, after the template's system part


def _prompt_tail(prompt: str) -> str:
    """The end of a rendered prompt, where its question is (the whole template is long)."""
    prompt = prompt.strip()
    return prompt if len(prompt) <= PROMPT_SHOWN else "…" + prompt[-PROMPT_SHOWN:]


def completions_frame(job_dir: str, lang: str = "en") -> pd.DataFrame:
    """grpo: the latest sampled completions (completions.jsonl) with their rewards, newest first."""
    headers = [t("jobs.col_step", lang), t("jobs.col_prompt", lang), t("jobs.col_completion", lang),
               t("jobs.col_reward", lang), t("jobs.col_rewards", lang)]
    try:
        lines = JobLayout(job_dir).completions.read_text(encoding="utf-8").splitlines()[-COMPLETIONS_SHOWN:]
    except OSError:
        return pd.DataFrame([], columns=headers)
    rows = []
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue   # a line being written
        each = ", ".join(f"{k} {v:g}" for k, v in (record.get("rewards") or {}).items())
        rows.append([record.get("step"), _prompt_tail(str(record.get("prompt", ""))),
                     str(record.get("completion", ""))[:300], record.get("reward"), each])
    return pd.DataFrame(rows, columns=headers)
