"""The pair preview of preference data: the prompt, then the chosen and the rejected answer side by
side, as the model sees them (chat-templated). The prompt is dim (never trained); each answer is
highlighted like the trained answer of the SFT preview (studio/render.py), since every answer token
enters the preference loss. KTO rows show their one completion with its label.

Input: the dicts of jobs.data.preference.preview_pairs ({prompt, chosen, rejected}, {prompt,
completion, label} or {error}). Everything from the dataset goes through html.escape."""
from __future__ import annotations

import html
from typing import Any

from studio.i18n import t
from studio.render import ANSWER_STYLE, BLOCK_STYLE, PROMPT_STYLE, legend_html, notice_html

CHOSEN_COLOR, REJECTED_COLOR = "#16a34a", "#dc2626"
SIDE_STYLE = "flex:1 1 0;min-width:0;"


def _block(text: str, trained: bool, css: str) -> str:
    style = ANSWER_STYLE if trained else PROMPT_STYLE
    kind = "ft-answer" if trained else "ft-prompt"
    return (f'<div class="{css}" style="{BLOCK_STYLE}"><span class="{kind}" style="{style}">'
            f'{html.escape(text)}</span></div>')


def _side(title: str, color: str, text: str, css: str) -> str:
    head = (f'<div style="font-size:12px;font-weight:600;color:{color}">{html.escape(title)}</div>')
    return f'<div style="{SIDE_STYLE}">{head}{_block(text, True, css)}</div>'


def _answers(item: dict[str, Any], lang: str) -> str:
    if "completion" in item:   # KTO: one answer, desirable or not
        good = bool(item.get("label"))
        title = t("preview.desirable" if good else "preview.undesirable", lang)
        return _side(title, CHOSEN_COLOR if good else REJECTED_COLOR, str(item["completion"]),
                     "ft-completion ft-desirable" if good else "ft-completion ft-undesirable")
    return (_side(t("preview.chosen", lang), CHOSEN_COLOR, str(item.get("chosen", "")), "ft-chosen")
            + _side(t("preview.rejected", lang), REJECTED_COLOR, str(item.get("rejected", "")), "ft-rejected"))


def pairs_html(items: list[dict[str, Any]], lang: str = "en") -> str:
    """The preview of the first preference rows; a row that could not be read says why."""
    if not items:
        return notice_html(t("preview.empty", lang), "warn")
    legend = legend_html(t("preview.legend_pair", lang), lang)
    cards = []
    for number, item in enumerate(items, start=1):
        name = (t("preview.example", lang, number=number) if "completion" in item   # KTO: one answer a row
                else t("preview.pair", lang, number=number))
        title = f'<div style="font-size:12px;opacity:.8">{html.escape(name)}</div>'
        if "error" in item:
            cards.append(title + notice_html(str(item["error"]), "error"))
            continue
        prompt = _block(str(item.get("prompt", "")), False, "ft-pair-prompt")
        sides = f'<div style="display:flex;gap:10px;align-items:stretch">{_answers(item, lang)}</div>'
        cards.append(f'<div class="ft-pair">{title}{prompt}{sides}</div>')
    return f'<div id="ft-preview-pairs">{legend}{"".join(cards)}</div>'
