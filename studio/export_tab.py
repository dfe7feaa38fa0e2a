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
import yaml

from jobs.export import ExportError, default_zip_path, estimate_sizes, export_adapter_zip
from jobs.export.files import human_size
from jobs.export.protocol import ERROR_PREFIX, NOTE_PREFIX, PROGRESS_LINE, RESULT_PREFIX
from jobs.io.layout import JobLayout
from jobs.messages import say
from jobs.io.storage import describe, is_disk_error
from studio import jobs_view as view
from studio import render
from studio.context import PICKER_REFRESH, StudioContext
from studio.export_runs import ExportRuns
from studio.i18n import t
from studio.server_text import translated

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("adapter", "merged", "gguf")
QUANTS = ("f16", "bf16", "q8_0")
RESULT_LINE = re.compile(r"^(.*) \(([^()]*)\)$")


@dataclass
class ExportTab:
    select: gr.Dropdown
    picked: gr.State   # the job the user chose in `select` themselves (None: follow the newest)

    def refresh(self, ctx: StudioContext, picked: str | None, lang: str) -> Any:
        """The update for `select`: the exportable jobs, the user's pick kept, else the newest."""
        choices = export_choices(ctx, lang)
        values = [value for _, value in choices]
        return gr.update(choices=choices, value=picked if picked in values else (values[0] if values else None))


@dataclass
class ExportOutcome:
    files: list[tuple[str, str]] = field(default_factory=list)  # (path, human size)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


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


def sizes_text(sizes: dict[str, int], lang: str = "en") -> str:
    """One line of what each export would weigh, or "" when unknown."""
    if not sizes:
        return ""
    parts = [f"{name}: {human_size(size)}" for name, size in sizes.items()]
    return t("export.sizes", lang, sizes=" · ".join(parts))


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
        offered = offered_copy(archive)
    except ExportError as exc:
        return gr.update(value=None, interactive=False), render.notice_html(translated(str(exc), lang), "error"), ""
    except OSError as exc:   # a full disk: a sentence for people, not Gradio's raw "[Errno 28]" toast
        if not is_disk_error(exc):
            raise
        return (gr.update(value=None, interactive=False),
                render.notice_html(t("export.zip_not_offered", lang, name=default_zip_path(Path(record.job_dir)).name,
                                     error=describe(getattr(exc, "filename", None) or record.job_dir, exc)),
                                   "error"), model_card_text(record.job_dir, lang))
    size_mb = archive.stat().st_size / 2 ** 20   # MiB, as every size on the page is binary
    estimate = sizes_text(estimate_sizes(record.job_dir, ctx.data_dir), lang)
    status = render.notice_html(t("export.ready", lang, name=archive.name, size=f"{size_mb:.1f}")
                                + (f"\n{estimate}" if estimate else ""), "ok")
    return (gr.update(value=str(offered), interactive=True, label=t("export.download_named", lang, name=archive.name)),
            status, model_card_text(record.job_dir, lang))


def offered_copy(archive: Path) -> Path:
    """The zip's copy in Gradio's cache, made here: the download button serves files from there, and
    Gradio made that copy after this tab's handler returned (every page load offers the newest job's
    zip), where a full disk could only end as a raw "[Errno 28]" toast. A path already in the cache
    is served as it is; the same bytes are copied once (Gradio names the copy by their hash)."""
    from gradio import processing_utils
    from gradio.utils import get_upload_folder
    return Path(processing_utils.save_file_to_cache(archive, get_upload_folder()))


def export_command(ctx: StudioContext, job_dir: str, fmt: str, quant: str) -> list[str]:
    return [sys.executable, "-m", "jobs.export", str(job_dir), "--format", fmt, "--quant", quant,
            "--data-dir", str(ctx.data_dir)]


def run_export(command: list[str], on_progress: Callable[[float, str], None], runs: ExportRuns | None = None,
               key: str = "", job_dir: str | None = None) -> ExportOutcome:
    """Run the export CLI, reporting its progress lines; its result and note lines, or its error.
    It runs in its own process group, which `runs.cancel(key)` stops (studio/export_runs.py)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    runs = runs or ExportRuns()
    run = runs.start(key, command, job_dir or ".", cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True, env=env)
    try:
        outcome = _read_outcome(run.proc, on_progress)
    finally:
        runs.done(key, run)
    if run.cancelled:   # a SIGKILL after the grace time prints no line of its own
        outcome.error = say("export_cancelled")
    return outcome


def _read_outcome(proc: subprocess.Popen, on_progress: Callable[[float, str], None]) -> ExportOutcome:
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


def format_choices(lang: str = "en") -> list[tuple[str, str]]:
    return [(t(f"export.format_{name}", lang), name) for name in FORMATS]


def quant_choices(lang: str = "en") -> list[tuple[str, str]]:
    return [(t(f"export.quant_{name}", lang), name) for name in QUANTS]


def _usage_hint(fmt: str, path: str, lang: str = "en") -> str:
    folder = html.escape(str(Path(path).parent if fmt == "gguf" else path))
    return t(f"export.hint_{fmt}", lang, folder=folder, path=html.escape(path))


def outcome_html(fmt: str, outcome: ExportOutcome, lang: str = "en") -> str:
    if outcome.error:
        return render.notice_html(t("export.failed", lang, error=translated(outcome.error, lang)), "error")
    rows = "".join(f"<li><code>{html.escape(path)}</code> — <b>{html.escape(size)}</b></li>"
                   for path, size in outcome.files)
    notes = "".join(f"<li>{html.escape(translated(note, lang))}</li>" for note in outcome.notes)
    hint = _usage_hint(fmt, outcome.files[0][0], lang) if outcome.files else ""
    return (f'<div class="ft-export-result"><b>{t("export.exported", lang)}</b><ul>{rows}</ul>'
            + (f"<b>{t('export.notes', lang)}</b><ul>{notes}</ul>" if notes else "") + f"<p>{hint}</p></div>")


def downloadable(outcome: ExportOutcome) -> list[str]:
    """Files the browser can download: each file written, the Modelfile beside a GGUF, and for a
    merged folder a zip of it (when small enough to copy) followed by the folder's own files."""
    files = [path for path, _ in outcome.files if Path(path).is_file()]
    modelfiles = [str(Path(p).parent / "Modelfile") for p in files if p.endswith(".gguf")]
    folders = [item for path, _ in outcome.files for item in folder_downloads(Path(path)) if Path(path).is_dir()]
    return files + [m for m in dict.fromkeys(modelfiles) if Path(m).is_file() and m not in files] + folders


ZIP_FOLDER_LIMIT = 4 << 30   # above this a zip would double a big model on the disk: its files are offered alone


def folder_downloads(folder: Path) -> list[str]:
    """A merged folder as downloads: <folder>.zip (stored, not compressed: safetensors do not
    shrink) when the folder is under ZIP_FOLDER_LIMIT, then every file in it."""
    import zipfile
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    offered = [str(p) for p in files]
    if not files or sum(p.stat().st_size for p in files) > ZIP_FOLDER_LIMIT:
        return offered
    archive, partial = folder.with_suffix(".zip"), folder.with_name(f".{folder.name}.zip.partial")
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED, allowZip64=True) as bundle:
            for path in files:
                bundle.write(path, f"{folder.name}/{path.relative_to(folder)}")
        partial.replace(archive)
    except OSError:   # a full disk: the files themselves are still offered
        partial.unlink(missing_ok=True)
        return offered
    return [str(archive), *offered]


def start_export(ctx: StudioContext, job_id: str | None, fmt: str, quant: str,
                 on_progress: Callable[[float, str], None], lang: str = "en", runs: ExportRuns | None = None,
                 key: str = "") -> tuple[str, list[str]]:
    """(status HTML, downloadable files) after running one export of the picked job; `runs.cancel(key)`
    stops it."""
    record = ctx.runner.get(job_id) if job_id else None
    if record is None:
        return render.notice_html(t("export.pick_job", lang), "warn"), []
    outcome = run_export(export_command(ctx, record.job_dir, fmt, quant), on_progress, runs, key, record.job_dir)
    return outcome_html(fmt, outcome, lang), downloadable(outcome)


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
    with gr.Row(equal_height=True):
        fmt = bind(gr.Radio(format_choices(), value="gguf", elem_id="ft-export-format", scale=3),
                   label="export.format", choices=format_choices)
        quant = bind(gr.Dropdown(quant_choices(), value="q8_0", elem_id="ft-export-quant", scale=1),
                     label="export.quant", choices=quant_choices)
        run = bind(gr.Button(variant="primary", elem_id="ft-export-run", scale=0, min_width=140), value="export.run")
        cancel = bind(gr.Button(variant="stop", elem_id="ft-export-cancel", scale=0, min_width=140),
                      value="export.cancel")
    result = gr.HTML(elem_id="ft-export-result")
    files = bind(gr.File(file_count="multiple", interactive=False, elem_id="ft-export-files"), label="export.files")
    card = gr.Markdown(elem_id="ft-model-card", container=True)
    tab = ExportTab(select=select, picked=gr.State(None))
    # only the user's own pick is kept on refresh: the page's automatic choice follows the newest job
    select.input(lambda job_id: job_id, select, tab.picked)

    def on_select(job_id: str | None, language: str) -> tuple[Any, str, str]:
        return prepare(ctx, job_id, language)

    runs = ExportRuns()   # by page: Cancel stops the export its own page started

    def on_run(job_id: str | None, chosen: str, tensor_type: str, language: str, request: gr.Request,
               progress: gr.Progress = gr.Progress()) -> Iterator[tuple[str, Any]]:
        yield render.notice_html(t("export.running", language), "info"), gr.update(value=None)
        status_html, paths = start_export(ctx, job_id, chosen, tensor_type,
                                          lambda fraction, message: progress(fraction, desc=message), language,
                                          runs, request.session_hash or "")
        yield status_html, gr.update(value=paths or None)

    def on_cancel(request: gr.Request) -> None:
        runs.cancel(request.session_hash or "")

    select.change(on_select, [select, ctx.lang], [download, status, card])
    fmt.change(lambda chosen: gr.update(visible=chosen == "gguf"), fmt, quant)
    run.click(on_run, [select, fmt, quant, ctx.lang], [result, files], api_name="export")
    cancel.click(on_cancel, None, None, api_name="export_cancel", show_progress="hidden")
    refresh_btn.click(lambda picked, language: tab.refresh(ctx, picked, language), [tab.picked, ctx.lang], select,
                      **PICKER_REFRESH)
    ctx.lang.change(lambda picked, language: tab.refresh(ctx, picked, language), [tab.picked, ctx.lang], select,
                    show_progress="hidden", **PICKER_REFRESH)
    return tab
