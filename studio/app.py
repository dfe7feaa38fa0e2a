"""build_studio(): the whole Gradio app. It builds the UI and wires the tabs together; it does not
launch, start threads or load models (app.py launches; models load on first chat/preview)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from studio.chat_tab import build_chat_tab
from studio.context import StudioContext
from studio.export_tab import build_export_tab
from studio.jobs_tab import build_jobs_tab, refresh
from studio.train_tab import build_train_tab

TITLE = "Fusetune Studio"


def build_studio(data_dir: Path, runner: Any, context: StudioContext | None = None) -> gr.Blocks:
    """The studio for `data_dir`, submitting jobs through `runner` (a jobs.runner.Runner)."""
    ctx = context or StudioContext(data_dir=Path(data_dir), runner=runner)
    # analytics off: no version-check thread, and nothing outside is reachable anyway
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"# {TITLE}\nLoRA / QLoRA fine-tuning on Fusetune's Triton-fused engine.",
                    elem_id="ft-header")
        with gr.Tabs(elem_id="ft-tabs") as tabs:
            with gr.Tab("Train", id="train", elem_id="ft-tab-train"):
                train = build_train_tab(ctx)
            with gr.Tab("Jobs", id="jobs", elem_id="ft-tab-jobs") as jobs_tab_item:
                jobs = build_jobs_tab(ctx)
            with gr.Tab("Export", id="export", elem_id="ft-tab-export") as export_tab_item:
                export = build_export_tab(ctx)
            with gr.Tab("Chat", id="chat", elem_id="ft-tab-chat") as chat_tab_item:
                chat = build_chat_tab(ctx)

        def after_start(job_id: str) -> list[Any]:
            if not job_id:
                return [gr.skip()] * (1 + len(jobs.refresh_outputs))
            return [gr.Tabs(selected="jobs"), *refresh(ctx, job_id, None, None)]

        train.started_job.change(after_start, train.started_job, [tabs, *jobs.refresh_outputs])
        jobs_tab_item.select(lambda job_id: refresh(ctx, job_id, None, None), jobs.select,
                             jobs.refresh_outputs, show_progress="hidden")
        export_tab_item.select(lambda: export.refresh(ctx), None, export.select)
        chat_tab_item.select(lambda: chat.refresh(ctx), None, [chat.adapter, chat.model])

        def on_load() -> list[Any]:
            return [*refresh(ctx, None, None, None), export.refresh(ctx), *chat.refresh(ctx),
                    *train.refresh_choices(ctx)]

        demo.load(on_load, None, [*jobs.refresh_outputs, export.select, chat.adapter, chat.model,
                                  train.model, train.dataset])
    return demo
