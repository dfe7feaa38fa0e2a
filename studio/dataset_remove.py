"""Remove an uploaded dataset from the Train tab's list (a broken upload otherwise stays there for
good): a Remove button beside Upload, shown while the picked dataset is an upload, that asks first
and deletes the file from <data_dir>/datasets/. Built-in datasets and files outside datasets/
(an --allow-dir path typed in) are never deleted; neither is a file a queued or running job reads."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from jobs.io import paths
from jobs.queue.store import JobState
from studio import form
from studio.i18n import t
from studio.uploads import known_datasets


def uploaded_file(data_dir: Path, value: str | None) -> Path | None:
    """The upload `value` names, when it is a file directly in the data dir's datasets/ folder."""
    if not value or not value.strip():
        return None
    folder = paths.datasets_dir(data_dir).resolve()
    path = Path(value.strip())
    try:
        resolved = path.resolve()
    except OSError:
        return None
    if not resolved.is_file():
        return None
    if resolved.parent == folder:
        return resolved
    return resolved if _unpacked_folder(folder, resolved) is not None else None


def _unpacked_folder(folder: Path, data_file: Path) -> Path | None:
    """The <name>-<tag>.unzipped folder right under datasets/ that holds `data_file` (an uploaded
    .zip's data file and its images, jobs/io/dataset_zip.py), if it is one."""
    from jobs.io.dataset_zip import UNZIPPED
    for parent in data_file.parents:
        if parent.parent == folder:
            return parent if parent.name.endswith(UNZIPPED) else None
    return None


def remove_upload(data_dir: Path, runner: Any, value: str) -> Path:
    """Delete the uploaded dataset `value`; a FieldError (naming the dataset field) says why not."""
    path = uploaded_file(data_dir, value)
    if path is None:
        raise form.FieldError("dataset", "remove_not_upload", name=value)
    for record in runner.store.list(states=(JobState.QUEUED, JobState.RUNNING)):
        if str((record.spec or {}).get("dataset", "")).strip() in (value.strip(), str(path)):
            raise form.FieldError("dataset", "remove_in_use", name=path.name, job=record.id)
    unpacked = _unpacked_folder(paths.datasets_dir(data_dir).resolve(), path)
    if unpacked is not None:   # an uploaded .zip: its data file goes with its images
        shutil.rmtree(unpacked, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    return path


@dataclass
class RemoveControls:
    button: gr.Button
    confirm: gr.Group
    question: gr.HTML
    yes: gr.Button
    no: gr.Button


def build_remove(page: Any) -> RemoveControls:
    """The Remove button and its question, built where the upload button is."""
    button = page.bind(gr.Button(size="sm", visible=False, elem_id="ft-dataset-remove"), value="train.remove")
    with gr.Group(visible=False, elem_id="ft-dataset-remove-confirm") as confirm:
        question = gr.HTML(elem_id="ft-dataset-remove-text")
        with gr.Row():
            yes = page.bind(gr.Button(variant="stop", size="sm", elem_id="ft-dataset-remove-yes"),
                            value="train.remove_yes")
            no = page.bind(gr.Button(size="sm", elem_id="ft-dataset-remove-no"), value="confirm.no")
    return RemoveControls(button, confirm, question, yes, no)


def wire_remove(ctx: Any, controls: RemoveControls, dataset: Any, upload_info: Any, preview: Any) -> None:
    from studio import render

    asked = gr.State("")   # the file the question names: Yes removes that one, whatever is picked since

    def shown(value: str) -> Any:
        return gr.update(visible=uploaded_file(ctx.data_dir, value) is not None)

    def ask(value: str, lang: str) -> tuple[Any, str, str]:
        name = Path(value or "").name
        return (gr.update(visible=True), render.notice_html(t("train.remove_question", lang, name=name), "warn"),
                value)

    def remove(value: str, lang: str) -> tuple[Any, ...]:
        try:
            path = remove_upload(ctx.data_dir, ctx.runner, value)
        except form.FieldError as exc:
            return gr.skip(), gr.update(visible=False), render.notice_html(form.error_text(exc, lang), "error"), ""
        choices = [(c, c) for c in known_datasets(ctx.data_dir)]
        return (gr.update(choices=choices, value=choices[0][1]), gr.update(visible=False),
                render.notice_html(t("train.removed", lang, name=path.name), "ok"), "")

    dataset.change(shown, dataset, controls.button, show_progress="hidden")
    controls.button.click(ask, [dataset, ctx.lang], [controls.confirm, controls.question, asked])
    controls.no.click(lambda: gr.update(visible=False), None, controls.confirm)
    controls.yes.click(remove, [asked, ctx.lang], [dataset, controls.confirm, upload_info, preview])
