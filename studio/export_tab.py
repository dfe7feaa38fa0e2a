"""The Export tab: a finished job's adapter as a zip download, and its model card."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from jobs.export import ExportError, export_adapter_zip
from jobs.layout import JobLayout
from studio import jobs_view as view
from studio import render
from studio.context import StudioContext


@dataclass
class ExportTab:
    select: gr.Dropdown

    def refresh(self, ctx: StudioContext) -> Any:
        """The update for `select`: the current list of exportable jobs."""
        return gr.update(choices=export_choices(ctx))


def export_choices(ctx: StudioContext) -> list[tuple[str, str]]:
    return [view.job_choice(r) for r in ctx.runner.list_jobs() if view.exportable(r)]


def model_card_text(job_dir: str) -> str:
    card = JobLayout(job_dir).model_card
    return card.read_text(encoding="utf-8") if card.is_file() else "_This adapter has no model card._"


def prepare(ctx: StudioContext, job_id: str | None) -> tuple[Any, str, str]:
    """(download button update, status HTML, model card markdown) for the picked job."""
    if not job_id:
        return gr.update(value=None, interactive=False), "", ""
    record = ctx.runner.get(job_id)
    if record is None:
        return gr.update(value=None, interactive=False), render.notice_html(f"No job {job_id}.", "error"), ""
    try:
        archive = export_adapter_zip(record.job_dir)
    except ExportError as exc:
        return gr.update(value=None, interactive=False), render.notice_html(str(exc), "error"), ""
    size_mb = archive.stat().st_size / 1e6
    status = render.notice_html(f"{archive.name} ({size_mb:.1f} MB): the PEFT adapter, tokenizer and "
                                "model card.", "ok")
    return (gr.update(value=str(archive), interactive=True, label=f"Download {archive.name}"),
            status, model_card_text(record.job_dir))


def build_export_tab(ctx: StudioContext) -> ExportTab:
    gr.Markdown("Finished jobs (and cancelled ones that saved an adapter) can be downloaded as a zip "
                "loadable with `peft.PeftModel.from_pretrained(base, folder)`.")
    with gr.Row():
        select = gr.Dropdown(label="Job", choices=[], value=None, elem_id="ft-export-select", scale=4)
        refresh_btn = gr.Button("Refresh list", size="sm", scale=0, min_width=120, elem_id="ft-export-refresh")
    with gr.Row():
        download = gr.DownloadButton("Download adapter zip", interactive=False, variant="primary",
                                     elem_id="ft-export-download", scale=0, min_width=260)
        status = gr.HTML(elem_id="ft-export-status")
    card = gr.Markdown(elem_id="ft-model-card", container=True)

    def on_select(job_id: str | None) -> tuple[Any, str, str]:
        return prepare(ctx, job_id)

    select.change(on_select, select, [download, status, card])
    refresh_btn.click(lambda: gr.update(choices=export_choices(ctx)), None, select)
    return ExportTab(select=select)
