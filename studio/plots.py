"""Line plots with a colour per series that draw as the data arrives.

Gradio's LinePlot (vega-lite, gradio 6) builds its chart spec, including the colour scale's
domain (the series names in the value), only when the component mounts or a spec prop changes; a
new value only swaps the data. A job's loss plot mounts empty, so its first series was outside the
domain and its line was never drawn (the axes still rescaled) until the tab was re-entered.
`series_update` sends a colour map naming the series of this value: a new series changes the map,
the chart is rebuilt with it, and the line appears at once."""
from __future__ import annotations

import gradio as gr
import pandas as pd

# colour-blind friendly (Okabe & Ito), the accent first: the training loss is always the first series
PALETTE = ("#e66100", "#0072b2", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")


def series_colors(frame: pd.DataFrame, column: str = "series") -> dict[str, str] | None:
    names = list(dict.fromkeys(frame[column].tolist())) if column in frame else []
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)} or None


def series_update(frame: pd.DataFrame, column: str = "series") -> dict:
    """The plot's value plus the colour map that makes its chart know every series it holds."""
    return gr.update(value=frame, color_map=series_colors(frame, column))
