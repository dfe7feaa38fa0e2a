"""Line plots with a colour per series that draw as the data arrives.

Gradio's LinePlot (vega-lite, gradio 6) builds its chart spec, including the colour scale's
domain (the series names in the value), only when the component mounts or a spec prop changes; a
new value only swaps the data. A job's loss plot mounts empty, so its first series was outside the
domain and its line was never drawn (the axes still rescaled) until the tab was re-entered.
A changed `color_map` rebuilds the chart, from the data it holds at that moment. Sent together
with the new value, the rebuild races the value (it was built from the old, empty data), so the
map goes in a follow-up event once the value is there (`ColorSync`, chained with `.then`), and
only when the set of series changed."""
from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

# colour-blind friendly (Okabe & Ito), the accent first: the training loss is always the first series
PALETTE = ("#e66100", "#0072b2", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")


def series_names(shown: Any, column: str = "series") -> list[str]:
    """The series of a plot's value: a DataFrame, or what the page sends back (PlotData / dict)."""
    if shown is None:
        return []
    if isinstance(shown, pd.DataFrame):
        return list(dict.fromkeys(shown[column].tolist())) if column in shown else []
    columns = shown.get("columns") if isinstance(shown, dict) else getattr(shown, "columns", None)
    rows = shown.get("data") if isinstance(shown, dict) else getattr(shown, "data", None)
    if not columns or column not in columns or not rows:
        return []
    at = list(columns).index(column)
    return list(dict.fromkeys(row[at] for row in rows))


def series_colors(shown: Any, column: str = "series") -> dict[str, str] | None:
    names = series_names(shown, column)
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)} or None


def color_sync(shown: Any, sent: dict | None) -> tuple[dict, dict | None]:
    """(update for the plot, colours now sent): a colour map naming the series of the value the
    plot shows in the page (its own value as the event's input: reading the job again could find
    a series the page does not hold yet, and the chart would be rebuilt without it), or gr.skip()
    when the chart knows them."""
    colors = series_colors(shown)
    if colors == sent:
        return gr.skip(), sent
    return gr.update(color_map=colors), colors
