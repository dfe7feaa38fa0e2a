"""Preference jobs' reward curves for the Jobs and Compare tabs (pure: summaries in, frames out).

A DPO/ORPO/SimPO/KTO job's step events carry reward_margin and reward_accuracy (the mean over the
step's pairs of chosen minus rejected reward, and the share of pairs whose chosen reward is the
higher: TRL's rewards/margins and rewards/accuracies); its eval events carry them as
eval_reward_margin and eval_reward_accuracy (jobs/train/methods/preference.py). One frame holds
them all as series of step -> value; an SFT job has none, so its frame is empty and the chart
stays hidden."""
from __future__ import annotations

from typing import Any

import pandas as pd

from jobs.io.events import JobSummary
from studio.i18n import t
from studio.jobs_view import chart_frame

# the step events' fields plotted; eval events carry them as eval_<field>
REWARD_METRICS = ("reward_margin", "reward_accuracy")
REWARD_COLUMNS = {"step": "int64", "value": "float64", "series": "string"}


def _points(events: list[dict[str, Any]], field: str) -> dict[int, float]:
    """{step: value}; a step seen twice (a resumed job) keeps its latest value, null is left out."""
    return {int(e["step"]): float(e[field]) for e in events
            if isinstance(e.get(field), (int, float)) and not isinstance(e.get(field), bool) and "step" in e}


def metric_label(field: str, lang: str) -> str:
    return t("plot.reward_margin", lang) if field == "reward_margin" else t("plot.reward_accuracy", lang)


def reward_series(summary: JobSummary, lang: str = "en") -> list[tuple[str, dict[int, float]]]:
    """(series name, points) for each reward metric the job reported, training then eval."""
    out = []
    for field in REWARD_METRICS:
        label = metric_label(field, lang)
        for events, name, prefix in ((summary.steps, label, ""),
                                     (summary.evals, t("plot.eval_of", lang, metric=label), "eval_")):
            points = _points(events, prefix + field)
            if points:
                out.append((name, points))
    return out


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return chart_frame(rows, REWARD_COLUMNS)


def reward_frame(summary: JobSummary, lang: str = "en") -> pd.DataFrame:
    """step, value, series: reward margin and accuracy per step (and at each eval); empty for SFT."""
    return _frame([{"step": s, "value": v, "series": name}
                   for name, points in reward_series(summary, lang) for s, v in sorted(points.items())])


def reward_curves_frame(runs: list[tuple[str, JobSummary]], lang: str = "en") -> pd.DataFrame:
    """The reward frames of several runs overlaid, each series named "<run> · <metric>"."""
    return _frame([{"step": s, "value": v, "series": f"{label} · {name}"}
                   for label, summary in runs for name, points in reward_series(summary, lang)
                   for s, v in sorted(points.items())])
