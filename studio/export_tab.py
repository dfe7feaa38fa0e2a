"""The Export tab: a finished job's adapter zip at once, and on request a merged model or a GGUF
(llama.cpp / Ollama), with a progress bar and the size of every file written.

An export runs `python -m jobs.export` in a subprocess (exactly the CLI, as Start runs the train
CLI): its memory is given back when it ends, and its `[ 42%] message` lines drive the progress bar."""
from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr

from jobs.export import ExportError, estimate_sizes, export_adapter_zip
from jobs.export.files import human_size
from jobs.export.protocol import ERROR_PREFIX, NOTE_PREFIX, PROGRESS_LINE, RESULT_PREFIX
from jobs.layout import JobLayout
from studio import jobs_view as view
from studio import render
from studio.context import StudioContext

ROOT = Path(__file__).resolve().parents[1]
FORMAT_CHOICES = [("Adapter: PEFT zip + llama.cpp LoRA GGUF", "adapter"),
                  ("Merged model: Hugging Face safetensors folder", "merged"),
                  ("GGUF for llama.cpp and Ollama (with a Modelfile)", "gguf")]
QUANT_CHOICES = [("f16: full quality", "f16"), ("bf16: full range", "bf16"), ("q8_0: half the size", "q8_0")]
RESULT_LINE = re.compile(r"^(.*) \(([^()]*)\)$")


@dataclass
class ExportTab:
    select: gr.Dropdown

    def refresh(self, ctx: StudioContext) -> Any:
        """The update for `select`: the current list of exportable jobs."""
        return gr.update(choices=export_choices(ctx))


@dataclass
class ExportOutcome:
    files: list[tuple[str, str]] = field(default_factory=list)  # (path, human size)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def export_choices(ctx: StudioContext) -> list[tuple[str, str]]:
    return [view.job_choice(r) for r in ctx.runner.list_jobs() if view.exportable(r)]


def model_card_text(job_dir: str) -> str:
    card = JobLayout(job_dir).model_card
    return card.read_text(encoding="utf-8") if card.is_file() else "_This adapter has no model card._"


def sizes_text(sizes: dict[str, int]) -> str:
    """One line of what each export would weigh, or "" when unknown."""
    if not sizes:
        return ""
    parts = [f"{name}: {human_size(size)}" for name, size in sizes.items()]
    return "Export sizes, about: " + " · ".join(parts)


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
    estimate = sizes_text(estimate_sizes(record.job_dir, ctx.data_dir))
    status = render.notice_html(f"{archive.name} ({size_mb:.1f} MB): the PEFT adapter, tokenizer and "
                                "model card." + (f"\n{estimate}" if estimate else ""), "ok")
    return (gr.update(value=str(archive), interactive=True, label=f"Download {archive.name}"),
            status, model_card_text(record.job_dir))


def export_command(ctx: StudioContext, job_dir: str, fmt: str, quant: str) -> list[str]:
    return [sys.executable, "-m", "jobs.export", str(job_dir), "--format", fmt, "--quant", quant,
            "--data-dir", str(ctx.data_dir)]


def run_export(command: list[str], on_progress: Callable[[float, str], None]) -> ExportOutcome:
    """Run the export CLI, reporting its progress lines; its result and note lines, or its error."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    outcome, tail = ExportOutcome(), []
    for line in proc.stdout:
        line = line.rstrip("\n")
        progress = PROGRESS_LINE.match(line)
        if progress:
            on_progress(int(progress.group(1)) / 100, progress.group(2))
        elif line.startswith(RESULT_PREFIX):
            found = RESULT_LINE.match(line[len(RESULT_PREFIX):])
            outcome.files.append((found.group(1), found.group(2)) if found else (line[len(RESULT_PREFIX):], ""))
        elif line.startswith(NOTE_PREFIX):
            outcome.notes.append(line[len(NOTE_PREFIX):])
        elif line.startswith(ERROR_PREFIX):
            outcome.error = line[len(ERROR_PREFIX):]
        tail = (tail + [line])[-20:]
    if proc.wait() != 0 and outcome.error is None:
        outcome.error = "the export stopped unexpectedly: " + " | ".join(tail[-5:])
    return outcome


def _usage_hint(fmt: str, path: str) -> str:
    folder = html.escape(str(Path(path).parent if fmt == "gguf" else path))
    if fmt == "gguf":
        return (f"Ollama: <code>ollama create my-model -f {folder}/Modelfile</code>; llama.cpp: "
                f"<code>llama-cli -m {html.escape(path)}</code>. Check it in the Chat tab (pick it as the model).")
    if fmt == "merged":
        return ("Load it with <code>AutoModelForCausalLM.from_pretrained(folder)</code>, or pick it as the "
                "model in the Chat tab to check it.")
    return "The .gguf beside the zip is the same LoRA for <code>llama-cli -m base.gguf --lora adapter.gguf</code>."


def outcome_html(fmt: str, outcome: ExportOutcome) -> str:
    if outcome.error:
        return render.notice_html(f"Export failed: {outcome.error}", "error")
    rows = "".join(f"<li><code>{html.escape(path)}</code> — <b>{html.escape(size)}</b></li>"
                   for path, size in outcome.files)
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in outcome.notes)
    hint = _usage_hint(fmt, outcome.files[0][0]) if outcome.files else ""
    return (f'<div class="ft-export-result"><b>Exported:</b><ul>{rows}</ul>'
            + (f"<b>Notes:</b><ul>{notes}</ul>" if notes else "") + f"<p>{hint}</p></div>")


def downloadable(outcome: ExportOutcome) -> list[str]:
    """Single files the browser can download (a merged folder is listed, not offered)."""
    files = [path for path, _ in outcome.files if Path(path).is_file()]
    modelfiles = [str(Path(p).parent / "Modelfile") for p in files if p.endswith(".gguf")]
    return files + [m for m in dict.fromkeys(modelfiles) if Path(m).is_file() and m not in files]


def start_export(ctx: StudioContext, job_id: str | None, fmt: str, quant: str,
                 on_progress: Callable[[float, str], None]) -> tuple[str, list[str]]:
    """(status HTML, downloadable files) after running one export of the picked job."""
    record = ctx.runner.get(job_id) if job_id else None
    if record is None:
        return render.notice_html("Pick a finished job first.", "warn"), []
    outcome = run_export(export_command(ctx, record.job_dir, fmt, quant), on_progress)
    return outcome_html(fmt, outcome), downloadable(outcome)


def build_export_tab(ctx: StudioContext) -> ExportTab:
    gr.Markdown("Finished jobs (and cancelled ones that saved an adapter) can be downloaded as a zip "
                "loadable with `peft.PeftModel.from_pretrained(base, folder)`, or exported as a merged "
                "model or a GGUF for llama.cpp and Ollama.")
    with gr.Row():
        select = gr.Dropdown(label="Job", choices=[], value=None, elem_id="ft-export-select", scale=4)
        refresh_btn = gr.Button("Refresh list", size="sm", scale=0, min_width=120, elem_id="ft-export-refresh")
    with gr.Row():
        download = gr.DownloadButton("Download adapter zip", interactive=False, variant="primary",
                                     elem_id="ft-export-download", scale=0, min_width=260)
        status = gr.HTML(elem_id="ft-export-status")
    with gr.Row(equal_height=True):
        fmt = gr.Radio(FORMAT_CHOICES, value="gguf", label="Export as", elem_id="ft-export-format", scale=3)
        quant = gr.Dropdown(QUANT_CHOICES, value="q8_0", label="GGUF tensor type", elem_id="ft-export-quant",
                            scale=1)
        run = gr.Button("Export", variant="primary", elem_id="ft-export-run", scale=0, min_width=140)
    result = gr.HTML(elem_id="ft-export-result")
    files = gr.File(label="Files", file_count="multiple", interactive=False, elem_id="ft-export-files")
    card = gr.Markdown(elem_id="ft-model-card", container=True)

    def on_select(job_id: str | None) -> tuple[Any, str, str]:
        return prepare(ctx, job_id)

    def on_run(job_id: str | None, chosen: str, tensor_type: str,
               progress: gr.Progress = gr.Progress()) -> Iterator[tuple[str, Any]]:
        yield render.notice_html("Exporting…", "info"), gr.update(value=None)
        status_html, paths = start_export(ctx, job_id, chosen, tensor_type,
                                          lambda fraction, message: progress(fraction, desc=message))
        yield status_html, gr.update(value=paths or None)

    select.change(on_select, select, [download, status, card])
    fmt.change(lambda chosen: gr.update(visible=chosen == "gguf"), fmt, quant)
    run.click(on_run, [select, fmt, quant], [result, files])
    refresh_btn.click(lambda: gr.update(choices=export_choices(ctx)), None, select)
    return ExportTab(select=select)
