"""The Train tab: the JobSpec form, a live view of the command Start runs, data preview, Start."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from jobs.spec import BUILTIN_DATASET, DATASET_SUFFIXES, JobSpec, SpecError
from studio import form
from studio.context import StudioContext
from studio.dataset_remove import build_remove, wire_remove
from studio.uploads import (  # noqa: F401  (re-exported: the tab and its tests name them here)
    UPLOAD_SAMPLE_ROWS, describe_dataset, known_datasets, safe_upload_name, store_reward_upload, store_upload, upload_notice)
from studio.i18n import t
from studio.method_fields import dataset_default_update, wire_method
from studio.newest_event import stamped
from studio.server_text import translated
from studio.data_preview import preview_data
from studio.data_stats import wire_stats
from studio.train_start import FIT_FIELDS, fit_for_form, start_job


@dataclass
class TrainTab:
    inputs: list[gr.components.Component]
    names: list[str]
    start: gr.Button
    status: gr.HTML
    started_job: gr.Textbox  # the id of the job Start just submitted ("" when none)
    model: gr.Dropdown
    dataset: gr.Dropdown
    command: gr.Code
    fit: gr.HTML          # predicted peak GPU memory beside the chosen GPU's free memory
    confirm: gr.State     # the config key Start warned about ("" when none)
    gpu_boxes: gr.CheckboxGroup  # this machine's GPUs; checking some writes the `gpus` field
    budget: gr.Textbox    # max_gpu_memory_gb, prefilled from the chosen GPU's free memory

    def fit_check(self, ctx: StudioContext, lang: str, *values: Any) -> str:
        """The fit check's HTML for the form's values (the page load and field changes)."""
        return fit_for_form(ctx.start_check, self.names, list(values), lang)

    def refresh_choices(self, ctx: StudioContext, lang: str = "en") -> list[Any]:
        """Updates for [model, dataset, GPU boxes, budget]: models earlier jobs used, datasets
        uploaded so far, the GPUs with their free memory now, the budget those leave."""
        return [gr.update(choices=ctx.known_models()),
                gr.update(choices=[(c, c) for c in known_datasets(ctx.data_dir)]),
                self.gpu_update(ctx, lang), budget_update(ctx, [])]

    @staticmethod
    def gpu_update(ctx: StudioContext, lang: str = "en") -> Any:
        """The GPU boxes' labels now (free memory, our jobs on each) in the page's language."""
        return gr.update(choices=gpu_choices(ctx, lang))


def gpu_inventory(ctx: StudioContext) -> list[Any]:
    """jobs.io.gpus.GpuInfo of every GPU of this machine ([] without NVIDIA GPUs or NVML)."""
    inventory = getattr(ctx.runner, "gpu_inventory", None)
    return inventory() if inventory else []


def gpu_choices(ctx: StudioContext, lang: str = "en") -> list[tuple[str, str]]:
    """(label, index) for each GPU: its name, free memory and the jobs of ours running on it."""
    choices = []
    for gpu in gpu_inventory(ctx):
        busy = t("train.gpu_busy", lang, jobs=", ".join(gpu.busy_by_jobs)) if gpu.busy_by_jobs else ""
        choices.append((t("train.gpu_label", lang, index=gpu.index, name=gpu.name, free=f"{gpu.free_gb:.1f}",
                          total=f"{gpu.total_gb:.1f}") + busy, str(gpu.index)))
    return choices


def prefilled_budget(inventory: list[Any], checked: list[str] | None) -> float | None:
    """max_gpu_memory_gb for the chosen GPUs (none checked: the first, where gpus auto starts):
    the least free memory among them, less the queue's margin (jobs/gpus.budget_for_free), so
    the job starts on them; None without GPUs (the field stays 0: it is for GPUs)."""
    from jobs.io.gpus import budget_for_free
    picked = {int(index) for index in checked or []}
    chosen = [g for g in inventory if g.index in picked] or inventory[:1]
    return budget_for_free(min(g.free_gb for g in chosen)) if chosen else None


def budget_update(ctx: StudioContext, checked: list[str] | None) -> Any:
    budget = prefilled_budget(gpu_inventory(ctx), checked)
    return gr.skip() if budget is None else gr.update(value=form.number_text(budget))


def gpus_value(checked: list[str] | None) -> str:
    """The `gpus` key for the checked boxes: "0,1", or "auto" when none is checked."""
    return ",".join(str(index) for index in sorted({int(i) for i in checked or []})) or "auto"


def command_text(runner: Any, data_dir: Path, names: list[str], values: list[Any], lang: str = "en") -> str:
    """The YAML plus the command Start would run, or the validation error naming the field (the
    studio's read policy first: a path it may not read and a missing one get the same answer)."""
    from jobs.checks.access import DataAccess
    try:
        data = DataAccess.for_studio(data_dir).check_values(form.values_to_dict(names, values))
        spec = JobSpec.from_dict(data)
    except SpecError as exc:
        return f"# {t('train.blocked', lang)}\n# {form.error_text(exc, lang)}\n"
    spec.output_dir = str(Path(data_dir) / "jobs" / "<job-id>")  # the runner assigns the real one
    yaml_text, argv = runner.preview_command(spec)
    command = shlex.join(str(a) for a in argv)
    return f"# {t('train.runs', lang)}\n#   {command}\n# {t('train.with_config', lang)}\n{yaml_text}"


def _unavailable(ctx: StudioContext, name: str) -> tuple[bool, str] | None:
    """(False, reason) for a switch this machine cannot honour (fused engine, FP8 base weights)."""
    probe = {"fused_kernels": ctx.fused_kernels, "base_precision": ctx.fp8_base_weights}.get(name)
    if probe is None:
        return None
    available, reason = probe()
    return None if available else (False, reason)


def _component(ctx: StudioContext, widget: form.FieldWidget) -> gr.components.Component:
    common = {"label": widget.label("en"), "info": widget.info("en"), "elem_id": f"ft-field-{widget.name}"}
    if _unavailable(ctx, widget.name):
        return gr.Checkbox(value=False, interactive=False, **common)
    if widget.kind == "dropdown":
        return gr.Dropdown(choices=list(widget.choices), value=widget.default,
                           allow_custom_value=widget.allow_custom, **common)
    if widget.kind == "checkbox":   # the fused engine starts on where it runs (the YAML default stays off)
        return gr.Checkbox(value=widget.default or widget.name == "fused_kernels", **common)
    # Numbers are text boxes parsed by form.parse_number: a number widget would coerce "abc" or a
    # blank to its previous value without a word, and 2.5 to 2 in an integer field.
    value = form.number_text(widget.default) if widget.kind in form.NUMBER_KINDS else str(widget.default)
    return gr.Textbox(value=value, lines=1, max_lines=1, **common)


def _bind_field(ctx: StudioContext, widget: form.FieldWidget, component: Any) -> None:
    """Label and help follow the page language; a switch this machine cannot use says why, and
    the FP8 switch says what it measured (bench/results)."""
    off = _unavailable(ctx, widget.name)

    def info(lang: str) -> str:
        text = t("train.fused_unavailable", lang, reason=translated(off[1], lang)) if off else widget.info(lang)
        if widget.name == "base_precision" and not off:  # measured H200 figures: only where FP8 can run
            from studio.fp8_effect import effect_text
            text = f"{text} {effect_text(lang)}"
        return text
    ctx.page.bind(component, label=widget.label, info=info)


def _build_fields(ctx: StudioContext) -> tuple[dict[str, Any], gr.UploadButton, gr.HTML]:
    """All form widgets, laid out in their groups. Returns (name -> component, upload button, upload info)."""
    groups = dict(form.grouped_widgets())
    made: dict[str, Any] = {}
    extras: dict[str, Any] = {}

    def place(group: str, visible: bool = True) -> None:
        with gr.Group(visible=visible, elem_id=f"ft-group-{group}") as box:
            extras[f"group.{group}"] = box
            ctx.page.bind(gr.Markdown(elem_classes=["ft-group-title"]),
                          value=lambda lang: f"**{t(f'group.{group}', lang)}**")
            for widget in groups[group]:
                if widget.name == "dataset":
                    widget.choices = tuple(known_datasets(ctx.data_dir))
                made[widget.name] = _component(ctx, widget)
                _bind_field(ctx, widget, made[widget.name])
                if widget.name == "dataset":
                    extras["upload"] = ctx.page.bind(
                        gr.UploadButton(file_types=[*DATASET_SUFFIXES, ".zip"], size="sm", elem_id="ft-upload"),
                        label="train.upload")
                    extras["upload_info"] = gr.HTML(elem_id="ft-upload-info")
                    made["dataset.remove"] = build_remove(ctx.page)  # studio/dataset_remove.py
                if widget.name == "reward_file" and _reward_uploads():
                    extras["reward_upload"] = ctx.page.bind(
                        gr.UploadButton(file_types=[".py"], size="sm", elem_id="ft-reward-upload"),
                        label="train.reward_upload")

    with gr.Row(equal_height=False):
        with gr.Column():
            place("data")
            if "preference" in groups:  # shown for a preference method only (method_fields.wire_method)
                place("preference", visible=False)
        with gr.Column():
            place("lora")
            place("engine")
        with gr.Column():
            place("training")
    with ctx.page.bind(gr.Accordion(open=False), label="group.more_settings"):
        with gr.Row(equal_height=False):
            with gr.Column():
                place("eval")
            with gr.Column():
                place("more")
                place("cluster")
                place("nodes")
            with gr.Column():
                place("grpo")
    if "reward_upload" in extras:
        _wire_reward_upload(ctx, extras["reward_upload"], made["reward_file"])
    made["group.preference"] = extras.get("group.preference")
    return made, extras["upload"], extras["upload_info"]


def _reward_uploads() -> bool:
    from jobs.checks.access import reward_uploads_allowed
    return reward_uploads_allowed()


def _wire_reward_upload(ctx: StudioContext, button: gr.UploadButton, field: Any) -> None:
    def on_reward_upload(file: str | None, language: str = "en") -> Any:
        if not file:
            return gr.skip()
        try:
            return gr.update(value=str(store_reward_upload(ctx.data_dir, file)))
        except SpecError as exc:
            raise gr.Error(form.error_text(exc, language)) from None
    button.upload(on_reward_upload, [button, ctx.lang] if ctx.lang is not None else [button], field)


def _gpu_boxes(ctx: StudioContext) -> gr.CheckboxGroup:
    """The GPUs as checkboxes; on a machine without any, an empty group that says so."""
    choices = gpu_choices(ctx)

    def info(lang: str) -> str:
        return t("train.gpus_info" if choices else "train.gpus_none", lang)
    boxes = gr.CheckboxGroup(choices=choices, value=[], interactive=bool(choices), elem_id="ft-gpus")
    return ctx.page.bind(boxes, label="train.gpus", info=info)


def build_train_tab(ctx: StudioContext) -> TrainTab:
    ctx.page.bind(gr.Markdown(), value="train.intro")
    made, upload, upload_info = _build_fields(ctx)
    gpu_boxes = _gpu_boxes(ctx)
    names = form.form_names()
    inputs = [made[name] for name in names]
    with gr.Row():
        start = ctx.page.bind(gr.Button(variant="primary", elem_id="ft-start", scale=0, min_width=200),
                              value="train.start")
        with gr.Column():
            fit = gr.HTML(elem_id="ft-fit")
            status = gr.HTML(elem_id="ft-train-status")
            stats_warning = gr.HTML(elem_id="ft-data-warning")   # max_seq_length cuts answers (studio/data_stats.py)
    started_job = gr.Textbox(visible=False, elem_id="ft-started-job")
    confirm = gr.State("")   # the config Start warned about: pressing Start again queues it
    with gr.Row(equal_height=False):
        with gr.Column():
            preview_btn = ctx.page.bind(gr.Button(elem_id="ft-preview-btn", size="sm"), value="train.preview")
            preview = gr.HTML(elem_id="ft-preview")
            stats_btn = ctx.page.bind(gr.Button(elem_id="ft-stats-btn", size="sm"), value="train.stats")
            stats = gr.HTML(elem_id="ft-data-stats")
        with gr.Column():
            command = ctx.page.bind(
                gr.Code(command_text(ctx.runner, ctx.data_dir, names, [made[n].value for n in names]),
                        language="yaml", interactive=False, elem_id="ft-command", lines=12, max_lines=40,
                        show_line_numbers=False),
                label="train.command")
    tab = TrainTab(inputs=inputs, names=names, start=start, status=status, started_job=started_job,
                   model=made["model"], dataset=made["dataset"], command=command, fit=fit, confirm=confirm,
                   gpu_boxes=gpu_boxes, budget=made["max_gpu_memory_gb"])
    # the text field stays the source of truth (auto, all or a list); the boxes write it
    gpu_boxes.input(gpus_value, gpu_boxes, made["gpus"])
    gpu_boxes.input(lambda checked: budget_update(ctx, checked), gpu_boxes, tab.budget)
    _wire(ctx, tab, made, upload, upload_info, preview_btn, preview)
    wire_stats(ctx, tab, stats_btn, stats, stats_warning)
    wire_remove(ctx, made["dataset.remove"], made["dataset"], upload_info, preview)
    return tab


def _wire(ctx: StudioContext, tab: TrainTab, made: dict[str, Any], upload: gr.UploadButton,
          upload_info: gr.HTML, preview_btn: gr.Button, preview: gr.HTML) -> None:
    judged = gr.State(None)   # [language, *values] the last Start answered for
    redraw_after = _wire_redraws(ctx, tab, made, judged)
    _wire_dataset(made, upload_info, preview, redraw_after)
    _wire_upload(ctx, tab, made, upload, upload_info, preview_btn, preview)
    _wire_start(ctx, tab, judged)


def _wire_redraws(ctx: StudioContext, tab: TrainTab, made: dict[str, Any], judged: gr.State) -> Callable:
    """The command box and the fit check follow every field; returns `redraw_after(event)`, which
    chains the same command redraw (same inputs, outputs and queue) after another event."""
    names, inputs, lang = tab.names, tab.inputs, ctx.lang

    def on_change(language: str, last: list | None, *values: Any) -> tuple[Any, ...]:
        command = command_text(ctx.runner, ctx.data_dir, names, list(values), language)
        if last == [language, *values]:
            # a redraw of the form Start just judged (an upload's chained field events can land after
            # Start's answer): its refusal or warning still applies, so it stays on the page
            return command, gr.skip(), gr.skip(), gr.skip()
        # the last Start's refusal or fit warning no longer applies once the form changed: the
        # command box says what is wrong now, and Start is plain Start again
        return command, "", "", gr.update(value=t("train.start", language))

    # one queue for every field's redraw, in the order the fields changed: each event carries the form
    # as it was when it fired, and separate listeners ran side by side, so a slow early one (the
    # method's, whose dataset swap fires more) could finish last and draw a stale config
    # (and the browser sends each event on its own: one that fired earlier may still arrive later,
    # so the stamp keeps the newest form's drawing: studio/newest_event.py)
    redraw = {**stamped(on_change, [lang, judged, *inputs], [tab.command, tab.status, tab.confirm, tab.start]),
              "show_progress": "hidden", "concurrency_id": "form-command", "concurrency_limit": 1}
    for component in [lang, *inputs]:
        component.change(**redraw, trigger_mode="always_last")

    def on_fit(language: str, *values: Any) -> str:
        return tab.fit_check(ctx, language, *values)

    fit = {**stamped(on_fit, [lang, *inputs], [tab.fit]), "show_progress": "hidden", "trigger_mode": "always_last",
           "concurrency_id": "form-fit", "concurrency_limit": 1}
    for name in FIT_FIELDS:
        made[name].change(**fit)
    return lambda event: event.then(**redraw)


def _wire_dataset(made: dict[str, Any], upload_info: gr.HTML, preview: gr.HTML,
                  redraw_after: Callable) -> None:
    """What follows the dataset and the method's pick of one: the identity fields, the learning rate,
    the command box."""
    def on_dataset(value: str, learning_rate: Any) -> tuple[Any, Any, Any]:
        identity = (value or "").strip() == BUILTIN_DATASET
        return (gr.update(visible=identity), gr.update(visible=identity),
                dataset_default_update("learning_rate", value, learning_rate))   # identity's own rate

    def on_method_dataset(value: str) -> tuple[Any, Any]:
        # a built-in set after the method's pick (sft -> dpo swaps identity for concise): the preview
        # and upload note shown were of the set before; an uploaded file keeps its own
        stale = gr.update(value="") if (value or "").strip().startswith("builtin:") else gr.skip()
        return stale, stale

    made["dataset"].change(on_dataset, [made["dataset"], made["learning_rate"]],
                           [made["bot_name"], made["bot_author"], made["learning_rate"]], show_progress="hidden")
    picked = wire_method(made)
    if picked is not None:
        picked.then(on_method_dataset, made["dataset"], [preview, upload_info], show_progress="hidden")
        # the dataset and beta the method set, drawn once they are on the page: the swapped dataset's
        # own change event did not always redraw (seen on a loaded 2-core machine: the field said
        # builtin:arithmetic, the box builtin:identity for good)
        redraw_after(picked)


def _wire_upload(ctx: StudioContext, tab: TrainTab, made: dict[str, Any], upload: gr.UploadButton,
                 upload_info: gr.HTML, preview_btn: gr.Button, preview: gr.HTML) -> None:
    """An uploaded dataset lands in the field with its note and preview; the preview button."""
    names, inputs, lang = tab.names, tab.inputs, ctx.lang

    def on_upload(file: str | None, language: str, learning_rate: Any) -> tuple[Any, str, Any]:
        if not file:
            return gr.skip(), gr.skip(), gr.skip()
        try:
            stored = store_upload(ctx.data_dir, file)
        except SpecError as exc:
            raise gr.Error(form.error_text(exc, language)) from None
        except OSError as exc:
            raise gr.Error(t("train.upload_failed", language, error=translated(str(exc), language))) from None
        # the rate that follows the dataset lands with it, not a redraw later: a Start pressed once the
        # upload's note shows judges the form as it stays (a late redraw cleared its answer, 2026-12-05)
        return (gr.update(choices=[(c, c) for c in known_datasets(ctx.data_dir)], value=str(stored)),
                upload_notice(stored, language), dataset_default_update("learning_rate", str(stored), learning_rate))

    def on_preview(language: str, *values: Any) -> str:
        return preview_data(ctx.data_dir, names, list(values), language)

    # the preview renders by itself after an upload: the user came to see their rows
    upload.upload(on_upload, [upload, lang, made["learning_rate"]], [made["dataset"], upload_info,
                                                                   made["learning_rate"]]).then(
        on_preview, [lang, *inputs], preview)
    preview_btn.click(on_preview, [lang, *inputs], preview)
    # another dataset picked by the user: the last upload's note and preview are about a file no longer chosen
    made["dataset"].input(lambda: ("", ""), None, [upload_info, preview], show_progress="hidden")


def _wire_start(ctx: StudioContext, tab: TrainTab, judged: gr.State) -> None:
    names, inputs, lang = tab.names, tab.inputs, ctx.lang

    def on_start(language: str, confirmed: str, *values: Any) -> tuple[Any, ...]:
        result = start_job(ctx.runner, ctx.start_check, names, list(values), language, confirmed)
        if result.job_id:   # the Jobs polls' shared reading lacks the new job
            ctx.shared.invalidate()
        label = t("train.start_anyway" if result.confirm else "train.start", language)
        return (result.status, result.job_id, result.confirm, gr.update(value=label),
                gr.skip() if result.fit is None else result.fit, [language, *values])

    # in the redraws' queue: a field's redraw fired before the click runs before Start's answer,
    # never after it (it would clear the answer the user is reading)
    tab.start.click(on_start, [lang, tab.confirm, *inputs],
                    [tab.status, tab.started_job, tab.confirm, tab.start, tab.fit, judged], api_name="start_job",
                    concurrency_id="form-command", concurrency_limit=1)
