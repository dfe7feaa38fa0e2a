"""Compare runs, pure parts: several jobs' loss curves in one frame, their configs side by side with
the keys whose values differ marked, and their latest evaluations' base-vs-tuned tables together."""
from __future__ import annotations

import html
from typing import Any

import pandas as pd

from jobs.evaluate import report
from jobs.io.events import JobSummary
from jobs.spec import JobSpec
from studio import plots
from studio.evaluate_tab import results_frame
from studio.i18n import t
from studio.jobs_view import LOSS_COLUMNS, chart_frame, loss_points

# Always different between two jobs (one folder each), so it would only hide the real differences.
NOT_COMPARED = ("output_dir",)
DIFF_STYLE = "background:rgba(250,204,21,.22);"
CELL_STYLE = "padding:4px 10px;border-bottom:1px solid rgba(128,128,128,.25);text-align:left;vertical-align:top;"


def run_label(record: Any) -> str:
    """How a run is named in the legend and the table: its name and id (names can repeat)."""
    return f"{record.name} ({record.id})"


def curves_frame(runs: list[tuple[str, JobSummary]], lang: str = "en") -> pd.DataFrame:
    """step, loss, series: each run's training loss and, where it evaluated, its eval loss."""
    rows = []
    for label, summary in runs:
        train, evals = loss_points(summary)
        for kind, points in ((t("plot.train_loss", lang), train), (t("plot.eval_loss", lang), evals)):
            series = f"{label} · {kind}"
            rows += [{"step": step, "loss": loss, "series": series} for step, loss in sorted(points.items())]
    return chart_frame(rows, LOSS_COLUMNS)


def legend_html(frame: pd.DataFrame) -> str:
    """The chart's legend below it, every series named in full and wrapping: vega-lite cuts a legend
    label at 160 px ("compare run (20261204-…"), where two runs differ only at the end of their names
    (issue 40 item 10). The colours are the ones the chart is sent (studio/plots.py series_colors)."""
    colors = plots.series_colors(frame) or {}
    items = "".join(
        f'<span class="ft-legend-item" style="display:inline-flex;align-items:center;gap:6px;margin:2px 14px 2px 0;'
        f'overflow-wrap:anywhere"><span style="flex:none;width:14px;height:3px;background:{color}"></span>'
        f'{html.escape(name)}</span>' for name, color in colors.items())
    return f'<div class="ft-legend" style="display:flex;flex-wrap:wrap;font-size:13px">{items}</div>' if items else ""


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return "" if value is None else str(value)


def config_rows(specs: list[dict[str, Any]]) -> list[tuple[str, list[str], bool]]:
    """(key, value per run, differs) for every JobSpec key in JobSpec order, then any others."""
    keys = [k for k in JobSpec.field_names() if k not in NOT_COMPARED]
    keys += sorted({k for spec in specs for k in spec} - set(keys) - set(NOT_COMPARED))
    rows = []
    for key in keys:
        values = [_shown(spec.get(key)) for spec in specs]
        rows.append((key, values, len(set(values)) > 1))
    return rows


def config_table_html(labels: list[str], specs: list[dict[str, Any]], only_diff: bool = False,
                      lang: str = "en") -> str:
    """The configs side by side; a differing key is marked (≠, highlighted, class ft-diff)."""
    if not specs:
        return ""
    rows = config_rows(specs)
    total, differing = len(rows), sum(1 for _, _, differs in rows if differs)
    if only_diff:
        rows = [row for row in rows if row[2]]
    head = "".join(f'<th style="{CELL_STYLE}">{html.escape(h)}</th>' for h in [t("compare.key", lang), *labels])
    body = []
    for key, values, differs in rows:
        mark = "≠ " if differs else ""
        cells = "".join(f'<td style="{CELL_STYLE}">{html.escape(v)}</td>' for v in values)
        style = DIFF_STYLE if differs else ""
        body.append(f'<tr class="{"ft-diff" if differs else "ft-same"}" data-key="{html.escape(key)}" '
                    f'style="{style}"><td style="{CELL_STYLE}"><code>{mark}{html.escape(key)}</code></td>{cells}</tr>')
    summary = html.escape(t("compare.differing", lang, count=differing, total=total))
    return (f'<div id="ft-compare-rows"><div style="font-size:13px;margin:4px 0 8px">{summary}</div>'
            f'<div style="overflow-x:auto"><table style="border-collapse:collapse;font-size:13px">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div></div>')


EVAL_COLUMNS = ["metric", "job", "evaluation", "rows", "base", "tuned", "difference", "95% CI"]


def evaluations_frame(runs: list[tuple[str, str]], lang: str = "en") -> tuple[pd.DataFrame, list[str]]:
    """(each run's latest evaluation, metric by metric with the runs of one metric next to each other;
    the labels of the runs that have none) for `runs` = (label, job folder) in the order picked. The
    table per run is the Evaluate tab's (base, tuned, difference, 95% interval, lm-eval tasks)."""
    frames, missing = [], []
    for order, (label, job_dir) in enumerate(runs):
        layout = report.latest(job_dir)
        frame = results_frame(layout)
        if layout is None or frame.empty:
            missing.append(label)
            continue
        cancelled = (report.read_results(layout) or {}).get("cancelled")
        name = layout.root.name + (f" ({t('compare.eval_cancelled', lang)})" if cancelled else "")
        frames.append(frame.assign(job=label, evaluation=name, order=order))
    if not frames:
        return pd.DataFrame(columns=EVAL_COLUMNS), missing
    metrics = list(dict.fromkeys(m for f in frames for m in f["metric"]))   # first-seen order
    table = pd.concat(frames, ignore_index=True)
    table["rank"] = table["metric"].map(metrics.index)
    return table.sort_values(["rank", "order"], kind="stable")[EVAL_COLUMNS].reset_index(drop=True), missing


def evaluations_note(missing: list[str], lang: str = "en") -> str:
    """The empty state, as text: which picked jobs have no evaluation yet, and where to make one."""
    return t("compare.no_evaluation", lang, jobs=", ".join(missing)) if missing else ""
