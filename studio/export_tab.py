"""The Export tab: a finished job's adapter as a zip download, and its model card."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import yaml

from jobs.export import ExportError, export_adapter_zip
from jobs.layout import JobLayout
from studio import jobs_view as view
from studio import render
from studio.context import StudioContext
from studio.i18n import t


@dataclass
class ExportTab:
    select: gr.Dropdown

    def refresh(self, ctx: StudioContext, picked: str | None, lang: str) -> Any:
        """The update for `select`: the exportable jobs, the user's pick kept, else the newest."""
        choices = export_choices(ctx, lang)
        values = [value for _, value in choices]
        return gr.update(choices=choices, value=picked if picked in values else (values[0] if values else None))


def export_choices(ctx: StudioContext, lang: str = "en") -> list[tuple[str, str]]:
    """Exportable jobs, newest first (the store lists newest first)."""
    return [view.job_choice(r, lang) for r in ctx.runner.list_jobs() if view.exportable(r)]


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(metadata, body) of a model card: the YAML between the leading --- lines is metadata for
    the hub, not text; markdown would render its closing --- as a heading underline."""
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---", 4)
    if end < 0:
        return {}, text
    try:
        meta = yaml.safe_load(text[4:end]) or {}
    except yaml.YAMLError:
        return {}, text
    if not isinstance(meta, dict):
        return {}, text
    return meta, text[end + 4:].lstrip("\n")


def model_card_text(job_dir: str, lang: str = "en") -> str:
    """The card as markdown: its metadata as a key/value table, then its body."""
    card = JobLayout(job_dir).model_card
    if not card.is_file():
        return t("export.no_card", lang)
    meta, body = split_front_matter(card.read_text(encoding="utf-8"))
    if not meta:
        return body
    rows = "\n".join(f"| `{key}` | {_cell(value)} |" for key, value in meta.items())
    return f"| {t('export.card_key', lang)} | {t('export.card_value', lang)} |\n|---|---|\n{rows}\n\n{body}"


def _cell(value: Any) -> str:
    text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def prepare(ctx: StudioContext, job_id: str | None, lang: str = "en") -> tuple[Any, str, str]:
    """(download button update, status HTML, model card markdown) for the picked job."""
    if not job_id:
        return gr.update(value=None, interactive=False), "", ""
    record = ctx.runner.get(job_id)
    if record is None:
        return (gr.update(value=None, interactive=False),
                render.notice_html(t("export.no_job", lang, job=job_id), "error"), "")
    try:
        archive = export_adapter_zip(record.job_dir)
    except ExportError as exc:
        return gr.update(value=None, interactive=False), render.notice_html(str(exc), "error"), ""
    size_mb = archive.stat().st_size / 1e6
    status = render.notice_html(t("export.ready", lang, name=archive.name, size=f"{size_mb:.1f}"), "ok")
    return (gr.update(value=str(archive), interactive=True, label=t("export.download_named", lang, name=archive.name)),
            status, model_card_text(record.job_dir, lang))


def build_export_tab(ctx: StudioContext) -> ExportTab:
    bind = ctx.page.bind
    bind(gr.Markdown(), value="export.intro")
    with gr.Row():
        select = bind(gr.Dropdown(choices=[], value=None, elem_id="ft-export-select", scale=4), label="export.job")
        refresh_btn = bind(gr.Button(size="sm", scale=0, min_width=120, elem_id="ft-export-refresh"),
                           value="export.refresh")
    with gr.Row():
        download = bind(gr.DownloadButton(interactive=False, variant="primary", elem_id="ft-export-download",
                                          scale=0, min_width=260), label="export.download")
        status = gr.HTML(elem_id="ft-export-status")
    card = gr.Markdown(elem_id="ft-model-card", container=True)
    tab = ExportTab(select=select)

    def on_select(job_id: str | None, language: str) -> tuple[Any, str, str]:
        return prepare(ctx, job_id, language)

    select.change(on_select, [select, ctx.lang], [download, status, card])
    refresh_btn.click(lambda picked, language: tab.refresh(ctx, picked, language), [select, ctx.lang], select)
    ctx.lang.change(lambda picked, language: tab.refresh(ctx, picked, language), [select, ctx.lang], select,
                    show_progress="hidden")
    return tab
