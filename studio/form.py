"""The Train form, derived from the JobSpec dataclass so the two cannot drift apart.

Every JobSpec field becomes one widget description (`FieldWidget`): its kind follows the field's
type and metadata (``choices`` -> dropdown, bool -> checkbox, int/float -> number with the
``min``/``max`` bounds, otherwise text) and its info text is ``metadata["help"]``. Only the layout
(which group a field sits in) is written here; a field missing from ``GROUPS`` still shows up, in
the "More" group, so adding a field to JobSpec adds it to the form.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from jobs.spec import BUILTIN_DATASET, BUILTIN_MODEL, JobSpec

# The runner assigns output_dir (one folder per job), so the form does not offer it.
NOT_IN_FORM = ("output_dir",)

GROUPS: dict[str, tuple[str, ...]] = {
    "Model & data": ("model", "dataset", "dataset_format", "bot_name", "bot_author"),
    "LoRA": ("lora_r", "lora_alpha", "lora_dropout", "target_modules"),
    "Engine": ("load_in_4bit", "fused_kernels", "gradient_checkpointing", "dtype"),
    "Training": ("learning_rate", "max_steps", "num_epochs", "batch_size",
                 "gradient_accumulation_steps", "max_seq_length", "seed"),
    "More": ("warmup_steps", "weight_decay", "max_grad_norm", "save_steps", "resume_from"),
}

LABELS = {
    "model": "Base model",
    "dataset": "Dataset",
    "dataset_format": "Format",
    "bot_name": "Bot name (builtin:identity)",
    "bot_author": "Bot author (builtin:identity)",
    "lora_r": "LoRA rank (r)",
    "lora_alpha": "LoRA alpha",
    "lora_dropout": "LoRA dropout",
    "target_modules": "Target modules",
    "load_in_4bit": "QLoRA (4-bit NF4 base)",
    "fused_kernels": "Fused Triton kernels",
    "gradient_checkpointing": "Gradient checkpointing",
    "dtype": "Precision",
    "max_seq_length": "Max length (tokens)",
    "batch_size": "Batch size",
    "gradient_accumulation_steps": "Gradient accumulation",
    "learning_rate": "Learning rate",
    "max_steps": "Max steps (0 = use epochs)",
    "num_epochs": "Epochs",
    "seed": "Seed",
}

MODEL_HINT = ("Hub id (org/name), a local Hugging Face folder, a .gguf file path, "
              f"or {BUILTIN_MODEL}.")


@dataclass
class FieldWidget:
    """How one JobSpec field is shown: enough to build a Gradio component from, and pure."""

    name: str
    kind: str  # "dropdown", "checkbox", "int", "float", "text"
    label: str
    info: str
    default: Any
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    allow_custom: bool = False
    extra: dict = field(default_factory=dict)


def _kind(f: dataclasses.Field) -> str:
    if "choices" in f.metadata:
        return "dropdown"
    return {"bool": "checkbox", "int": "int", "float": "float"}.get(str(f.type), "text")


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def field_widgets() -> list[FieldWidget]:
    """One FieldWidget per form field of JobSpec, in JobSpec order."""
    widgets = []
    for f in dataclasses.fields(JobSpec):
        if f.name in NOT_IN_FORM:
            continue
        widget = FieldWidget(
            name=f.name, kind=_kind(f), label=LABELS.get(f.name, f.name.replace("_", " ").capitalize()),
            info=f.metadata.get("help", ""), default=_default(f),
            choices=tuple(f.metadata.get("choices", ())),
            minimum=f.metadata.get("min"), maximum=f.metadata.get("max"))
        if f.name == "model":
            widget.kind, widget.allow_custom, widget.info = "dropdown", True, MODEL_HINT
            widget.choices = (BUILTIN_MODEL,)
        elif f.name == "dataset":
            widget.kind, widget.allow_custom = "dropdown", True
            widget.choices = (BUILTIN_DATASET,)
        elif f.name == "target_modules":
            widget.default = "all-linear"
            widget.info += " Comma-separated."
        widgets.append(widget)
    return widgets


def range_text(widget: FieldWidget) -> str:
    """The allowed range from the field's metadata, e.g. "(1 to 1024)"; "" when unbounded."""
    if widget.minimum is None and widget.maximum is None:
        return ""
    if widget.maximum is None:
        return f"(at least {widget.minimum:g})"
    if widget.minimum is None:
        return f"(at most {widget.maximum:g})"
    return f"({widget.minimum:g} to {widget.maximum:g})"


def grouped_widgets() -> list[tuple[str, list[FieldWidget]]]:
    """Widgets in their layout groups; any field not placed in GROUPS lands in "More"."""
    by_name = {w.name: w for w in field_widgets()}
    placed: set[str] = set()
    groups = []
    for title, names in GROUPS.items():
        members = [by_name[n] for n in names if n in by_name]
        placed.update(w.name for w in members)
        groups.append((title, members))
    leftovers = [w for name, w in by_name.items() if name not in placed]
    if leftovers:
        title, members = groups[-1]
        groups[-1] = (title, members + leftovers)
    return groups


def form_names() -> list[str]:
    """Field names in the order the form hands values to `values_to_dict`."""
    return [w.name for _, members in grouped_widgets() for w in members]


def values_to_dict(names: list[str], values: list[Any]) -> dict[str, Any]:
    """Widget values -> a JobSpec dict (JobSpec.from_dict coerces and validates it).

    Empty numbers are left out so the spec default applies; text is stripped; the target
    modules box takes 'all-linear' or comma-separated names.
    """
    data: dict[str, Any] = {}
    for name, value in zip(names, values):
        if value is None:
            continue
        if isinstance(value, str):
            value = value.strip()
        if name == "target_modules" and isinstance(value, str) and value not in ("", "all-linear"):
            value = [part.strip() for part in value.replace("\n", ",").split(",") if part.strip()]
        data[name] = value
    return data


def spec_to_values(spec: JobSpec, names: list[str]) -> list[Any]:
    """The inverse of `values_to_dict`: widget values that show `spec`."""
    values = []
    for name in names:
        value = getattr(spec, name)
        if name == "target_modules" and isinstance(value, (list, tuple)):
            value = ", ".join(value)
        values.append(value)
    return values
