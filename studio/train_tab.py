"""The Train tab: the JobSpec form, a live view of the command Start runs, data preview, Start."""
from __future__ import annotations

import re
import secrets
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from jobs import paths
from jobs.spec import BUILTIN_DATASET, DATASET_SUFFIXES, JobSpec, SpecError
from studio import form, render
from studio.context import StudioContext


@dataclass
class TrainTab:
    inputs: list[gr.components.Component]
    names: list[str]
    start: gr.Button
    status: gr.HTML
    started_job: gr.Textbox  # the id of the job Start just submitted ("" when none)
    model: gr.Dropdown
    dataset: gr.Dropdown

    def refresh_choices(self, ctx: StudioContext) -> list[Any]:
        """Updates for [model, dataset]: models earlier jobs used, datasets uploaded so far."""
        return [gr.update(choices=ctx.known_models()),
                gr.update(choices=[(c, c) for c in known_datasets(ctx.data_dir)])]


def safe_upload_name(original: str) -> str:
    """A file name for an uploaded dataset: the original stem reduced to [A-Za-z0-9._-], a random
    tag so two uploads of train.json never collide, and the original (allowed) suffix."""
    path = Path(original)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem).strip("._-")[:60] or "dataset"
    return f"{stem}-{secrets.token_hex(4)}{path.suffix.lower()}"


def store_upload(data_dir: Path, uploaded: str) -> Path:
    """Copy an uploaded file (Gradio's temp path) into <data_dir>/datasets/ and return the copy."""
    source = Path(uploaded)
    if source.suffix.lower() not in DATASET_SUFFIXES:
        raise SpecError("dataset", f"{source.name} is not a {', '.join(DATASET_SUFFIXES)} file")
    target = paths.datasets_dir(data_dir) / safe_upload_name(source.name)
    shutil.copyfile(source, target)
    return target


def known_datasets(data_dir: Path) -> list[str]:
    folder = Path(data_dir) / "datasets"
    files = sorted(p for p in folder.glob("*") if p.suffix.lower() in DATASET_SUFFIXES) if folder.is_dir() else []
    return [BUILTIN_DATASET] + [str(p) for p in files]


def command_text(runner: Any, data_dir: Path, names: list[str], values: list[Any]) -> str:
    """The YAML plus the command Start would run, or the validation error naming the field."""
    try:
        spec = JobSpec.from_dict(form.values_to_dict(names, values))
    except SpecError as exc:
        return f"# Start is blocked until this is fixed:\n# {exc}\n"
    spec.output_dir = str(Path(data_dir) / "jobs" / "<job-id>")  # the runner assigns the real one
    yaml_text, argv = runner.preview_command(spec)
    return f"# Start runs:\n#   {shlex.join(str(a) for a in argv)}\n# with this config.yaml:\n{yaml_text}"


def _component(widget: form.FieldWidget, fused: tuple[bool, str]) -> gr.components.Component:
    common = {"label": widget.label, "info": widget.info, "elem_id": f"ft-field-{widget.name}"}
    if widget.name == "fused_kernels" and not fused[0]:
        return gr.Checkbox(value=False, interactive=False, label=widget.label,
                           info=f"Unavailable here: {fused[1]}", elem_id=common["elem_id"])
    if widget.kind == "dropdown":
        return gr.Dropdown(choices=list(widget.choices), value=widget.default,
                           allow_custom_value=widget.allow_custom, **common)
    if widget.kind == "checkbox":
        return gr.Checkbox(value=widget.default, **common)
    if widget.kind in ("int", "float"):
        # No minimum/maximum on gr.Number: Gradio would refuse an out-of-range value with a message
        # that does not say which field; JobSpec's check names it (command box, Start).
        common["info"] = f"{widget.info} {form.range_text(widget)}".strip()
        return gr.Number(value=widget.default, precision=0 if widget.kind == "int" else None,
                         step=1 if widget.kind == "int" else 0.0001 if widget.name == "learning_rate" else 0.01,
                         **common)
    return gr.Textbox(value=str(widget.default), lines=1, **common)


def _build_fields(ctx: StudioContext, fused: tuple[bool, str]) -> tuple[dict[str, Any], gr.UploadButton]:
    """All form widgets, laid out in their groups. Returns (name -> component, upload button)."""
    groups = dict(form.grouped_widgets())
    made: dict[str, Any] = {}
    upload = None

    def place(title: str) -> None:
        nonlocal upload
        with gr.Group():
            gr.Markdown(f"**{title}**", elem_classes=["ft-group-title"])
            for widget in groups[title]:
                if widget.name == "dataset":
                    widget.choices = tuple(known_datasets(ctx.data_dir))
                made[widget.name] = _component(widget, fused)
                if widget.name == "dataset":
                    upload = gr.UploadButton("Upload .json / .jsonl / .csv / .parquet",
                                             file_types=list(DATASET_SUFFIXES), size="sm",
                                             elem_id="ft-upload")

    with gr.Row(equal_height=False):
        with gr.Column():
            place("Model & data")
        with gr.Column():
            place("LoRA")
            place("Engine")
        with gr.Column():
            place("Training")
    with gr.Accordion("More settings", open=False):
        place("More")
    return made, upload


def build_train_tab(ctx: StudioContext) -> TrainTab:
    fused = ctx.fused_kernels()
    gr.Markdown("Pick a base model and data, check the preview, then **Start**. The job runs as its own "
                "process: you can close the browser and come back.")
    made, upload = _build_fields(ctx, fused)
    names = form.form_names()
    inputs = [made[name] for name in names]
    with gr.Row():
        start = gr.Button("Start training", variant="primary", elem_id="ft-start", scale=0, min_width=200)
        status = gr.HTML(elem_id="ft-train-status")
    started_job = gr.Textbox(visible=False, elem_id="ft-started-job")
    with gr.Row(equal_height=False):
        with gr.Column():
            preview_btn = gr.Button("Preview data", elem_id="ft-preview-btn", size="sm")
            preview = gr.HTML(elem_id="ft-preview")
        with gr.Column():
            command = gr.Code(command_text(ctx.runner, ctx.data_dir, names, [made[n].value for n in names]),
                              language="yaml", interactive=False, label="Command and config",
                              elem_id="ft-command", lines=12, max_lines=40, show_line_numbers=False)

    def on_change(*values: Any) -> str:
        return command_text(ctx.runner, ctx.data_dir, names, list(values))

    for component in inputs:
        component.change(on_change, inputs, command, show_progress="hidden", trigger_mode="always_last")

    def on_dataset(value: str) -> tuple[Any, Any]:
        identity = (value or "").strip() == BUILTIN_DATASET
        return gr.update(visible=identity), gr.update(visible=identity)

    made["dataset"].change(on_dataset, made["dataset"], [made["bot_name"], made["bot_author"]],
                           show_progress="hidden")

    def on_upload(file: str | None) -> Any:
        if not file:
            return gr.skip()
        try:
            stored = store_upload(ctx.data_dir, file)
        except (SpecError, OSError) as exc:
            raise gr.Error(str(exc)) from None
        gr.Info(f"Saved as {stored.name}")
        return gr.update(choices=[(c, c) for c in known_datasets(ctx.data_dir)], value=str(stored))

    upload.upload(on_upload, upload, made["dataset"])

    def on_preview(*values: Any) -> str:
        return preview_data(ctx.data_dir, names, list(values))

    preview_btn.click(on_preview, inputs, preview)

    def on_start(*values: Any) -> tuple[str, str]:
        return start_job(ctx.runner, names, list(values))

    start.click(on_start, inputs, [status, started_job])
    return TrainTab(inputs=inputs, names=names, start=start, status=status, started_job=started_job,
                    model=made["model"], dataset=made["dataset"])


def preview_data(data_dir: Path, names: list[str], values: list[Any]) -> str:
    """The preview HTML, or an error box naming what is wrong (spec field, file/row/field)."""
    from jobs import data  # loads a tokenizer: imported on first use, not with the UI
    try:
        spec = JobSpec.from_dict(form.values_to_dict(names, values))
        return render.preview_html(data.preview_rows(spec, n=3, data_dir=data_dir))
    except (SpecError, data.DataError) as exc:
        return render.notice_html(str(exc), "error")
    except Exception as exc:  # model load failures etc.: show them, the form stays usable
        return render.notice_html(f"Could not build the preview: {type(exc).__name__}: {exc}", "error")


def start_job(runner: Any, names: list[str], values: list[Any]) -> tuple[str, str]:
    """Validate and submit. Returns (status HTML, started job id or "")."""
    try:
        spec = JobSpec.from_dict(form.values_to_dict(names, values))
        record = runner.submit(spec)
    except SpecError as exc:
        key = exc.key or "config"
        label = form.LABELS.get(key, key)
        message = str(exc).removeprefix(f"{exc.key}: ") if exc.key else str(exc)
        gr.Warning(f"Not started — {label} ({key}): {message}")
        return render.notice_html(f"Not started. {label} ({key}): {message}", "error"), ""
    return render.notice_html(f"Started job {record.id} ({record.name}).", "ok"), record.id

