"""Curves thinned to what a chart can show: at most MAX_POINTS points a series reach the page.

Why: every poll re-draws the Jobs tab's charts (vega, in the browser's main thread) with all their
points. A tiny CPU job runs thousands of steps a minute: at step 2,250 its page spent 6.5 s of every
10 s in long tasks (59 of them, up to 0.4 s) and a click took 10 s to answer, longer with every step
(measured 2026-12-04, headless chromium on 2 cores). A chart 600-odd pixels wide cannot show more
than a few hundred points anyway; TensorBoard keeps 1,000 samples of a scalar by default
(`--samples_per_plugin`) for the same reason.

How: each series longer than the limit keeps its first and last points and, in each of
(limit - 2) / 2 equal runs of the points between, the lowest and the highest (the M4 idea: Jugel et
al., "M4: A Visualization-Oriented Time Series Data Aggregation", VLDB 2014; plotly-resampler's
MinMax): a spike or a dip stays visible, the last step is always drawn. Series of up to the limit are
passed through untouched, so a short job's chart is exact.
"""
from __future__ import annotations

from typing import Any

MAX_POINTS = 500


def thin(rows: list[dict[str, Any]], x: str, y: str, series: str | None = None,
         limit: int = MAX_POINTS) -> list[dict[str, Any]]:
    """`rows` with each series (grouped by the `series` column; all rows when None) cut to `limit`
    points; series keep their first-seen order, points their order along `x`."""
    if len(rows) <= limit:
        return rows
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get(series) if series else None, []).append(row)
    return [point for part in groups.values() for point in _thin_one(part, x, y, limit)]


def _thin_one(rows: list[dict[str, Any]], x: str, y: str, limit: int) -> list[dict[str, Any]]:
    if len(rows) <= limit:
        return rows
    rows = sorted(rows, key=lambda row: row[x])
    inner, buckets = rows[1:-1], max(1, (limit - 2) // 2)
    kept = [rows[0]]
    for b in range(buckets):
        part = inner[len(inner) * b // buckets: len(inner) * (b + 1) // buckets]
        if not part:
            continue
        low, high = min(part, key=lambda row: row[y]), max(part, key=lambda row: row[y])
        kept += sorted({id(low): low, id(high): high}.values(), key=lambda row: row[x])
    kept.append(rows[-1])
    return kept
