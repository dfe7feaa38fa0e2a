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

import gradio as gr
import pandas as pd

# colour-blind friendly (Okabe & Ito), the accent first: the training loss is always the first series
PALETTE = ("#e66100", "#0072b2", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")


def series_colors(frame: pd.DataFrame, column: str = "series") -> dict[str, str] | None:
    names = list(dict.fromkeys(frame[column].tolist())) if column in frame else []
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)} or None


def color_sync(frame: pd.DataFrame | None, sent: dict | None) -> tuple[dict, dict | None]:
    """(update for the plot, colours now sent): a colour map naming the series of the value the
    plot already shows, or gr.skip() when the chart knows them."""
    colors = series_colors(frame) if frame is not None else None
    if colors == sent:
        return gr.skip(), sent
    return gr.update(color_map=colors), colors
