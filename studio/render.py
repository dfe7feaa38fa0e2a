"""Pure HTML rendering for the studio: data preview, progress bar, notices.

Everything user-controlled (dataset text, job names, error messages) goes through html.escape;
styles are inline so the output looks right whatever CSS the page was launched with.
"""
from __future__ import annotations

import html
from typing import Any, Iterable

from studio.i18n import t

PROMPT_STYLE = "color:#8a8f98;"
ANSWER_STYLE = ("background:rgba(250,204,21,.28);color:inherit;border-radius:3px;"
                "box-shadow:0 0 0 1px rgba(202,138,4,.45);")
BLOCK_STYLE = ("white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,SFMono-Regular,"
               "Menlo,monospace;font-size:13px;line-height:1.5;padding:10px 12px;margin:4px 0 14px;"
               "border:1px solid rgba(128,128,128,.35);border-radius:8px;")


def legend_html(answer_text: str, lang: str) -> str:
    """The line above a preview: what the dim text is (never trained) and what the highlight is."""
    return (f'<div style="margin-bottom:8px;font-size:13px">'
            f'<span style="{PROMPT_STYLE}">{html.escape(t("preview.legend_prompt", lang))}</span>'
            f' &nbsp;·&nbsp; <span style="{ANSWER_STYLE}">{html.escape(answer_text)}</span></div>')


def row_segments(row: dict[str, Any]) -> list[tuple[str, bool]]:
    """A preview row as (text, trained) pieces in order.

    jobs.data.dataset.preview_rows gives either {"segments": [(text, trained), ...]} (multi-turn) or
    {"prompt": ..., "answer": ...} where the full text is prompt + answer.
    """
    if row.get("segments") is not None:
        return [(str(text), bool(trained)) for text, trained in row["segments"]]
    return [(str(row.get("prompt", "")), False), (str(row.get("answer", "")), True)]


def preview_html(rows: Iterable[dict[str, Any]], lang: str = "en") -> str:
    """The rows exactly as the model sees them: masked prompt dim, trained answer highlighted."""
    rows = list(rows)
    if not rows:
        return notice_html(t("preview.empty", lang), "warn")
    legend = legend_html(t("preview.legend_answer", lang), lang)
    cards = []
    for number, row in enumerate(rows, start=1):
        spans = "".join(
            f'<span class="{"ft-answer" if trained else "ft-prompt"}" '
            f'style="{ANSWER_STYLE if trained else PROMPT_STYLE}">{html.escape(text)}</span>'
            for text, trained in row_segments(row) if text)
        tokens = row.get("tokens")
        title = (t("preview.example_tokens", lang, number=number, tokens=int(tokens))
                 if isinstance(tokens, (int, float)) else t("preview.example", lang, number=number))
        cards.append(f'<div style="font-size:12px;opacity:.8">{html.escape(title)}</div>'
                     + _thumbnails_open(row) +
                     f'<div class="ft-preview-row" style="{BLOCK_STYLE}">{spans}</div>'
                     + ("</div>" if row.get("thumbnails") else "") + _columns_line(row, lang))
    return f'<div id="ft-preview-rows">{legend}{"".join(cards)}</div>'


def _thumbnails_open(row: dict[str, Any]) -> str:
    """Image-text rows (jobs/data/vision_preview.py): the row's image thumbnails, left of its text."""
    uris = [u for u in row.get("thumbnails") or [] if isinstance(u, str) and u.startswith("data:image/png;base64,")]
    if not uris:
        return ""
    images = "".join(f'<img class="ft-thumb" src="{html.escape(u)}" alt="" '
                     f'style="max-width:96px;max-height:96px;border-radius:4px;margin:0 6px 6px 0">' for u in uris)
    return f'<div class="ft-preview-vision" style="display:flex;gap:8px;align-items:flex-start"><div>{images}</div>'


def _columns_line(row: dict[str, Any], lang: str) -> str:
    """grpo prompt rows: the columns their rewards receive (answer = 7, ...)."""
    if "columns" not in row:
        return ""
    shown = ", ".join(f"{k} = {str(v)[:80]}" for k, v in row["columns"].items()) or "-"
    return (f'<div class="ft-reward-columns" style="font-size:12px;margin:-4px 0 8px">'
            f'{html.escape(t("preview.reward_columns", lang, columns=shown))}</div>')


def identity_count_html(identity: int, general: int | None, prompts: int, lang: str = "en") -> str:
    """How many rows the built-in dataset really has (the preview shows only its first three)."""
    if general is None:
        text = t("preview.identity_count_pending", lang, identity=identity, prompts=prompts)
    else:
        text = t("preview.identity_count", lang, total=identity + general, identity=identity, general=general)
    return f'<div id="ft-preview-count" style="font-size:13px;margin-bottom:6px">{html.escape(text)}</div>'


NOTICE_COLORS = {"error": "#dc2626", "warn": "#d97706", "info": "#2563eb", "ok": "#16a34a"}


def notice_html(message: str, level: str = "info") -> str:
    color = NOTICE_COLORS.get(level, NOTICE_COLORS["info"])
    return (f'<div class="ft-notice ft-{level}" style="border-left:4px solid {color};padding:8px 12px;'
            f'margin:4px 0;background:rgba(128,128,128,.08);border-radius:4px;white-space:pre-wrap">'
            f'{html.escape(message)}</div>')


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "–"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


STATE_COLORS = {"queued": "#6b7280", "running": "#2563eb", "done": "#16a34a",
                "failed": "#dc2626", "cancelled": "#d97706"}


def phase_text(phase: dict, lang: str = "en") -> str:
    """"preparing data: 40/121 answers", or the phase alone when it has no count."""
    name = t(f"phase.{phase.get('phase', '')}", lang)
    if isinstance(phase.get("done"), int) and isinstance(phase.get("total"), int):
        unit = t(f"phase.unit_{phase['unit']}", lang) if phase.get("unit") else ""
        text = t("phase.counted", lang, phase=name, done=phase["done"], total=phase["total"], unit=unit).strip()
        if isinstance(phase.get("eta_s"), (int, float)):
            text += " · " + t("phase.left", lang, eta=format_duration(phase["eta_s"]))
        return text
    return name


def progress_html(state: str, step: int | None, max_steps: int | None,
                  progress: float | None, eta_s: float | None, elapsed_s: float | None,
                  lang: str = "en", phase: dict | None = None) -> str:
    """A progress bar with step count and ETA for one job (data-state keeps the English state
    name: it is for scripts and tests, the label is for people)."""
    state = str(state)
    fraction = min(max(progress or 0.0, 0.0), 1.0)
    if state == "done":
        fraction = 1.0
    color = STATE_COLORS.get(state, "#6b7280")
    steps = (t("progress.step_of", lang, step=step or 0, max=max_steps) if max_steps
             else t("progress.step", lang, step=step or 0))
    parts = [t(f"state.{state}", lang), steps, f"{fraction * 100:.0f}%"]
    if phase and state == "running":  # before this run's first step: say what it is doing
        parts = [parts[0], phase_text(phase, lang), *(parts[1:] if step else [])]
    if state == "running" and eta_s is not None:
        parts.append(t("progress.eta", lang, eta=format_duration(eta_s)))
    if elapsed_s is not None:
        parts.append(t("progress.elapsed", lang, elapsed=format_duration(elapsed_s)))
    label = html.escape(" · ".join(parts))
    return (f'<div id="ft-progress" data-state="{html.escape(state)}" data-step="{int(step or 0)}">'
            f'<div style="font-size:13px;margin-bottom:4px" class="ft-progress-label">{label}</div>'
            f'<div style="height:12px;border-radius:6px;background:rgba(128,128,128,.2);overflow:hidden">'
            f'<div style="height:100%;width:{fraction * 100:.1f}%;background:{color};'
            f'transition:width .5s"></div></div></div>')


def log_html(text: str, height_px: int = 300, lang: str = "en") -> str:
    """A log tail that opens scrolled to its end: a column-reverse flex box anchors the scroll
    position at the bottom without any script."""
    body = html.escape(text) if text else html.escape(t("log.empty", lang))
    return (f'<div id="ft-log-box" style="display:flex;flex-direction:column-reverse;overflow:auto;'
            f'max-height:{height_px}px;border:1px solid rgba(128,128,128,.35);border-radius:8px">'
            f'<pre style="margin:0;padding:8px 10px;font-size:12px;white-space:pre-wrap;'
            f'word-break:break-word">{body}</pre></div>')
