"""The results table: per metric the base and tuned means over the rows both scored, the difference
(tuned - base) and its 95% confidence interval by the paired bootstrap over rows (Koehn 2004, as
sacrebleu's paired bootstrap resampling and lm-eval's bootstrap stderr do it: the same resampled rows
for both models, so what is measured is the change, not the spread of either model alone)."""
from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95


def bootstrap_interval(differences: list[float], samples: int, seed: int) -> tuple[float, float]:
    """The central 95% interval of the mean of `differences` over `samples` resamples of the rows,
    the same for the same seed; (nan, nan) without rows."""
    values = np.asarray(differences, dtype=np.float64)
    if values.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = np.empty(samples, dtype=np.float64)
    chunk = max(1, 4_000_000 // values.size)   # bounded memory for many rows x many samples
    for start in range(0, samples, chunk):
        count = min(chunk, samples - start)
        picks = rng.integers(0, values.size, size=(count, values.size))
        means[start:start + count] = values[picks].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def metric_names(rows: list[dict]) -> list[str]:
    """Every metric the rows' scores name, in first-seen order."""
    names: dict[str, None] = {}
    for row in rows:
        for side in ("base", "tuned"):
            names.update(dict.fromkeys(row["scores"][side]))
    return list(names)


def results_table(rows: list[dict], samples: int, seed: int) -> list[dict]:
    """One entry per metric: {metric, rows, base, tuned, difference, ci_low, ci_high} over the rows
    where both models have a score (a row without a reference has no text scores)."""
    table = []
    for metric in metric_names(rows):
        paired = [(r["scores"]["base"].get(metric), r["scores"]["tuned"].get(metric)) for r in rows]
        paired = [(b, t) for b, t in paired if b is not None and t is not None]
        if not paired:
            continue
        base = float(np.mean([b for b, _ in paired]))
        tuned = float(np.mean([t for _, t in paired]))
        low, high = bootstrap_interval([t - b for b, t in paired], samples, seed)
        table.append({"metric": metric, "rows": len(paired), "base": base, "tuned": tuned,
                      "difference": tuned - base, "ci_low": low, "ci_high": high})
    return table


def format_table(table: list[dict]) -> str:
    """The table as aligned text for the terminal and the log."""
    head = f"{'metric':<22} {'rows':>5} {'base':>9} {'tuned':>9} {'diff':>9}  95% CI"
    lines = [head, "-" * len(head)]
    for e in table:
        lines.append(f"{e['metric']:<22} {e['rows']:>5} {e['base']:>9.3f} {e['tuned']:>9.3f} "
                     f"{e['difference']:>+9.3f}  [{e['ci_low']:+.3f}, {e['ci_high']:+.3f}]")
    return "\n".join(lines)
