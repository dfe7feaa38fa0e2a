"""The Train tab's dataset statistics (issue 22 item 7): a token-length histogram of the chosen
dataset (prompt and answer), the rows max_seq_length truncates and by how much, duplicate rows and
the trained-token share; and, beside Start, a warning when the cut takes answer tokens.

The numbers are the preflight's (jobs/data/stats.py through studio/start_check.py, in a child
process for large files), so they are what Start and `--dry-run` see. Drawn as plain HTML bars with
inline styles: no plotting dependency, and it reads the same in both themes."""
from __future__ import annotations

import html
from typing import Any

import gradio as gr

from jobs.spec import SpecError
from studio import form, render
from studio.i18n import t

PROMPT_COLOR, ANSWER_COLOR, CUT_COLOR = "#6b8fd6", "#3cb371", "#e07b39"
BAR_HEIGHT_PX = 90
MEASURED_FIELDS = ("dataset", "max_seq_length", "model")   # what the numbers depend on


def wire_stats(ctx: Any, tab: Any, button: Any, stats: Any, warning: Any) -> None:
    """Dataset statistics on demand (`button`), and the warning beside Start after a Start press too
    (its preflight measured the data). A change of the dataset, the model or max_seq_length clears
    both, unless they were measured for the values the form holds now: a field's change event can
    land after the numbers were drawn (an upload's chained events do, on a busy machine)."""
    shown_for = gr.State(None)   # MEASURED_FIELDS' values the numbers on the page were measured for
    where = [tab.names.index(name) for name in MEASURED_FIELDS]
    fields = [tab.inputs[i] for i in where]

    def measured(values: list[Any]) -> list[Any]:
        return [values[i] for i in where]

    def on_click(language: str, *values: Any) -> tuple[str, str, list[Any]]:
        return (*analyse(ctx.start_check, tab.names, list(values), language), measured(list(values)))

    def on_status(status: str, language: str, *values: Any) -> tuple[str, Any]:   # Start ran, or "" once cleared
        warned = warning_after_start(ctx.start_check, tab.names, list(values), status, language)
        return warned, (measured(list(values)) if status else gr.skip())

    shown = button.click(on_click, [ctx.lang, *tab.inputs], [stats, warning, shown_for])
    # the data now measured, the fit check sizes a CPU job by its longest row (jobs/models/fit_cpu.py)
    shown.then(lambda language, *values: tab.fit_check(ctx, language, *values), [ctx.lang, *tab.inputs], tab.fit,
               show_progress="hidden")
    tab.status.change(on_status, [tab.status, ctx.lang, *tab.inputs], [warning, shown_for], show_progress="hidden")
    for field in fields:
        field.change(stale_cleared, [shown_for, *fields], [stats, warning], show_progress="hidden")


def stale_cleared(shown_for: list[Any] | None, *current: Any) -> tuple[Any, Any]:
    """The statistics and the warning cleared, or left where they were measured for `current`."""
    return (gr.skip(), gr.skip()) if shown_for == list(current) else ("", "")


def analyse(check: Any, names: list[str], values: list[Any], lang: str = "en") -> tuple[str, str]:
    """(statistics HTML, warning HTML beside Start) for the form as it is."""
    try:
        spec = check.spec(names, values)
    except SpecError as exc:
        return render.notice_html(form.error_text(exc, lang), "error"), ""
    verdict = check.preflight(spec)
    train = next((d for d in verdict.datasets if d.get("key") == "dataset"), None)
    if train is None or not train.get("stats"):
        from studio.train_start import preflight_text
        text = preflight_text(verdict, lang) if verdict.problems else t("stats.none", lang)
        return render.notice_html(text, "error" if verdict.problems else "info"), ""
    return stats_html(train, lang), warning_html(train, lang)


def warning_after_start(check: Any, names: list[str], values: list[Any], status: str, lang: str = "en") -> str:
    """The warning beside Start once Start has run its preflight (which measured the data): read
    from what that preflight found, nothing measured again; "" when the status was cleared."""
    if not status:
        return ""
    try:
        spec = check.spec(names, values)
    except SpecError:
        return ""
    train = next((d for d in check.measured(spec) if d.get("key") == "dataset"), None)
    return warning_html(train, lang) if train else ""


def warning_html(summary: dict[str, Any], lang: str = "en") -> str:
    """The warning beside Start when max_seq_length cuts answers (lost training signal), else ""."""
    stats = summary.get("stats") or {}
    if not stats.get("answers_cut_rows"):
        return ""
    return render.notice_html(t("stats.answers_cut", lang, rows=f"{stats['answers_cut_rows']:,}",
                                measured=f"{stats['rows']:,}", tokens=f"{stats['answer_tokens_cut']:,}",
                                max=stats["max_seq_length"]), "warn")


def stats_html(summary: dict[str, Any], lang: str = "en") -> str:
    stats = summary["stats"]
    lines = [t("stats.title", lang, name=summary.get("name", ""), rows=f"{summary.get('rows', 0):,}")]
    if summary.get("sampled"):
        lines.append(t("stats.sampled", lang, sample=f"{summary['sampled']:,}"))
    if stats["truncated_rows"]:
        lines.append(t("stats.truncated", lang, rows=f"{stats['truncated_rows']:,}", max=stats["max_seq_length"],
                       mean=f"{stats['cut_tokens_mean']:,}", most=f"{stats['cut_tokens_max']:,}"))
    else:
        lines.append(t("stats.fits", lang, max=stats["max_seq_length"]))
    lines.append(t("stats.duplicates", lang, rows=f"{summary.get('duplicates', 0):,}"))
    lines.append(t("stats.trained_share", lang, share=f"{100 * stats['trained_share']:.1f}"))
    facts = "".join(f"<li>{html.escape(line)}</li>" for line in lines[1:])
    return (f'<div class="ft-data-stats" id="ft-data-stats-body"><b>{html.escape(lines[0])}</b>'
            f'<ul style="margin:4px 0 8px 18px">{facts}</ul>'
            f'{_histogram(stats, "prompt", PROMPT_COLOR, lang)}{_histogram(stats, "answer", ANSWER_COLOR, lang)}</div>')


def _ticks(edges: list[int], count: int = 5) -> list[int]:
    """Token counts under the bars, evenly spaced from the first edge to the last (a histogram with
    only its two ends labelled could not be read, issue 40)."""
    last = len(edges) - 1
    return [edges[round(i * last / (count - 1))] for i in range(count)] if last >= count - 1 else list(edges)


def _histogram(stats: dict[str, Any], part: str, color: str, lang: str) -> str:
    """One row of bars: rows per token-length bin; bins past max_seq_length drawn in the cut colour."""
    counts, edges, limit = stats[f"{part}_counts"], stats["edges"], stats["max_seq_length"]
    tallest = max(counts + [1])
    bars = []
    for count, low, high in zip(counts, edges, edges[1:]):
        height = max(1, round(BAR_HEIGHT_PX * count / tallest)) if count else 0
        fill = CUT_COLOR if low >= limit else color
        tip = html.escape(t("stats.bin", lang, low=f"{low:,}", high=f"{high - 1:,}", rows=f"{count:,}"))
        bars.append(f'<div class="ft-bar" title="{tip}" data-rows="{count}" style="flex:1;display:flex;'
                    f'flex-direction:column;justify-content:flex-end;align-items:center;height:{BAR_HEIGHT_PX + 14}px">'
                    f'<span style="font-size:10px">{count or ""}</span>'
                    f'<div style="width:90%;height:{height}px;background:{fill};border-radius:2px 2px 0 0"></div></div>')
    axis = (f'<div class="ft-axis" style="display:flex;justify-content:space-between;font-size:10px;opacity:.7">'
            f'{"".join(f"<span>{edge:,}</span>" for edge in _ticks(edges))}</div>'
            f'<div class="ft-axis-title" style="text-align:center;font-size:10px;opacity:.7">'
            f'{html.escape(t("stats.axis_title", lang))}'
            f'{html.escape(" · " + t("stats.axis", lang, max=limit)) if limit < edges[-1] else ""}</div>')
    title = html.escape(t("stats.prompt_lengths" if part == "prompt" else "stats.answer_lengths", lang))
    return (f'<div class="ft-histogram" data-part="{part}" style="margin:6px 0"><div style="font-size:12px">{title}</div>'
            f'<div style="display:flex;gap:2px;align-items:flex-end">{"".join(bars)}</div>{axis}</div>')
