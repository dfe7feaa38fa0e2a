"""The Train form, derived from the JobSpec dataclass so the two cannot drift apart.

Every JobSpec field becomes one widget description (`FieldWidget`): its kind follows the field's
type and metadata (``choices`` -> dropdown, bool -> checkbox, int/float -> number, otherwise text).
Its label and help come from the catalogue (studio/i18n.py: ``field.<name>``, ``help.<name>``,
the English help being JobSpec's ``metadata["help"]``). Only the layout (which group a field sits
in) is written here; a field missing from ``GROUPS`` still shows up, in the "more" group, so
adding a field to JobSpec adds it to the form.

Numbers are typed as text and parsed here, never coerced by the widget: "abc", a blank or (in an
integer field) 2.5 is refused naming the field, instead of silently keeping the previous value
as a number widget would.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass
from typing import Any

from jobs.spec import BUILTIN_DATASET, BUILTIN_DATASETS, BUILTIN_MODEL, DATASET_DEFAULTS, JobSpec, SpecError
from studio.i18n import field_help, field_label, t
from studio.server_text import translated

# The runner assigns output_dir (one folder per job), so the form does not offer it.
NOT_IN_FORM = ("output_dir",)

# Group keys are catalogue keys: group.<key> is the group's title.
GROUPS: dict[str, tuple[str, ...]] = {
    "data": ("name", "model", "method", "dataset", "dataset_format", "bot_name", "bot_author"),
    "lora": ("lora_r", "lora_alpha", "lora_dropout", "target_modules", "vision_lora"),
    "engine": ("load_in_4bit", "fused_kernels", "base_precision", "gradient_checkpointing", "packing", "dtype",
               "gpus", "max_gpu_memory_gb"),
    # a Ray cluster (jobs/train/cluster.py): empty cluster trains on this machine
    "cluster": ("cluster", "workers", "gpus_per_worker"),
    # several machines without Ray: torchrun's rendezvous, this machine's share (jobs/launch.py)
    "nodes": ("nodes", "node_rank", "rdzv_endpoint"),
    "training": ("learning_rate", "max_steps", "num_epochs", "batch_size",
                 "gradient_accumulation_steps", "max_seq_length", "seed"),
    "eval": ("eval_fraction", "eval_dataset", "eval_steps", "keep_best"),
    # shown only for preference methods (the Train tab hides it for sft)
    "preference": ("beta", "simpo_gamma", "orpo_lambda", "kto_desirable_weight", "kto_undesirable_weight",
                   "precompute_reference"),
    "grpo": ("num_generations", "max_completion_length", "rewards", "reward_file", "temperature", "top_p",
             "epsilon", "epsilon_high", "loss_type"),
    "more": ("warmup_steps", "weight_decay", "max_grad_norm", "save_steps", "processes", "sharding", "resume_from"),
}
# Which keys of the "preference" group each method reads (jobs/train/methods/preference.py; grpo reads
# beta, its KL weight); the Train tab shows only these, and the group only for a method that reads one.
PREFERENCE_KEYS = {"dpo": ("beta", "precompute_reference"), "orpo": ("orpo_lambda",),
                   "simpo": ("beta", "simpo_gamma"),
                   "kto": ("beta", "kto_desirable_weight", "kto_undesirable_weight", "precompute_reference"),
                   "grpo": ("beta",)}
NUMBER_KINDS = ("int", "float")
THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")


class FieldError(SpecError):
    """A form value refused before JobSpec sees it; `code` and `params` make it translatable
    (catalogue key ``error.<code>``)."""

    def __init__(self, key: str, code: str, **params: Any):
        self.code, self.params = code, params
        super().__init__(key, t(f"error.{code}", "en", **params))


@dataclass
class FieldWidget:
    """How one JobSpec field is shown: enough to build a Gradio component from, and pure."""

    name: str
    kind: str  # "dropdown", "checkbox", "int", "float", "text"
    default: Any
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    allow_custom: bool = False

    def label(self, lang: str) -> str:
        return field_label(self.name, lang)

    def info(self, lang: str) -> str:
        """The field's help, with the extra hint of the studio's widget and the allowed range."""
        if self.name == "model":
            return t("hint.model", lang, builtin=BUILTIN_MODEL)
        text = field_help(self.name, lang)
        if self.name == "target_modules":
            text = f"{text} {t('hint.target_modules', lang)}"
        return f"{text} {range_text(self, lang)}".strip()


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
        # the default dataset's own defaults (JobSpec DATASET_DEFAULTS): the form shows the default job
        default = DATASET_DEFAULTS.get(JobSpec.dataset, {}).get(f.name, _default(f))
        widget = FieldWidget(name=f.name, kind=_kind(f), default=default,
                             choices=tuple(f.metadata.get("choices", ())),
                             minimum=f.metadata.get("min"), maximum=f.metadata.get("max"))
        if f.name == "model":
            widget.kind, widget.allow_custom, widget.choices = "dropdown", True, (BUILTIN_MODEL,)
        elif f.name == "dataset":
            widget.kind, widget.allow_custom, widget.choices = "dropdown", True, BUILTIN_DATASETS
        elif f.name == "target_modules":
            widget.default = "all-linear"
        elif f.name == "base_precision":   # a switch: on = fp8, off = bf16 (the JobSpec values)
            widget.kind, widget.default, widget.choices = "checkbox", widget.default == "fp8", ()
        widgets.append(widget)
    return widgets


@functools.cache
def _kinds() -> dict[str, str]:
    return {w.name: w.kind for w in field_widgets()}


def format_number(value: float) -> str:
    """A bound or value for people: 1048576 -> "1,048,576", 1e6 -> "1,000,000", 1e-08 -> "1e-08"."""
    if float(value).is_integer() and abs(value) >= 1:
        return f"{int(value):,}"
    return f"{value:g}"


def range_text(widget: FieldWidget, lang: str = "en") -> str:
    """The allowed range from the field's metadata, e.g. "(1 to 1,024)"; "" when unbounded."""
    if widget.minimum is None and widget.maximum is None:
        return ""
    if widget.maximum is None:
        return t("range.at_least", lang, min=format_number(widget.minimum))
    if widget.minimum is None:
        return t("range.at_most", lang, max=format_number(widget.maximum))
    return t("range.between", lang, min=format_number(widget.minimum), max=format_number(widget.maximum))


def grouped_widgets() -> list[tuple[str, list[FieldWidget]]]:
    """Widgets in their layout groups; any field not placed in GROUPS lands in "more"."""
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


def preference_keys(method: str | None) -> tuple[str, ...]:
    """The preference keys `method` uses (none for sft or an unknown method)."""
    return PREFERENCE_KEYS.get((method or "").strip(), ())


def form_names() -> list[str]:
    """Field names in the order the form hands values to `values_to_dict`."""
    return [w.name for _, members in grouped_widgets() for w in members]


def parse_number(name: str, raw: Any) -> int | float:
    """The number typed into field `name`, or FieldError naming the field: blank, not a number,
    not finite, a fraction in an integer field, or outside the field's bounds."""
    kind = _kinds().get(name, "float")
    if isinstance(raw, bool):
        raise FieldError(name, "number_invalid", value=str(raw))
    text = raw.strip() if isinstance(raw, str) else raw
    if text is None or text == "":
        raise FieldError(name, "number_blank")
    if isinstance(text, str) and THOUSANDS.match(text):
        text = text.replace(",", "")  # "1,048,576" as the range hint prints it
    try:
        number = float(text)
    except (TypeError, ValueError):
        raise FieldError(name, "number_invalid", value=str(raw)) from None
    if not math.isfinite(number):
        raise FieldError(name, "number_invalid", value=str(raw))
    if kind == "int":
        if not number.is_integer():
            raise FieldError(name, "number_not_integer", value=str(raw).strip())
        number = int(number)
    _check_range(name, number)
    return number


def _check_range(name: str, number: float) -> None:
    meta = JobSpec.__dataclass_fields__[name].metadata
    if "min" in meta and number < meta["min"]:
        raise FieldError(name, "number_below_min", value=format_number(number), min=format_number(meta["min"]))
    if "max" in meta and number > meta["max"]:
        raise FieldError(name, "number_above_max", value=format_number(number), max=format_number(meta["max"]))


def values_to_dict(names: list[str], values: list[Any]) -> dict[str, Any]:
    """Widget values -> a JobSpec dict (JobSpec.from_dict validates the rest).

    Number fields are parsed strictly (FieldError names the field); text is stripped; the target
    modules box takes 'all-linear' or comma-separated names; a None from a widget that has no
    value (a cleared dropdown) leaves the key out so the spec default applies.
    """
    data: dict[str, Any] = {}
    for name, value in zip(names, values):
        if _kinds().get(name) in NUMBER_KINDS:
            data[name] = parse_number(name, value)
            continue
        if value is None:
            continue
        if isinstance(value, str):
            value = value.strip()
        if name == "base_precision" and isinstance(value, bool):
            value = "fp8" if value else "bf16"
        if name == "target_modules" and isinstance(value, str) and value not in ("", "all-linear"):
            value = [part.strip() for part in value.replace("\n", ",").split(",") if part.strip()]
        data[name] = value
    return data


def spec_to_values(spec: JobSpec, names: list[str]) -> list[Any]:
    """The inverse of `values_to_dict`: widget values that show `spec` (numbers as text)."""
    values = []
    for name in names:
        value = getattr(spec, name)
        if name in ("target_modules", "report_to") and isinstance(value, (list, tuple)):
            value = ", ".join(value)
        elif _kinds().get(name) in NUMBER_KINDS:
            value = number_text(value)
        elif name == "base_precision":
            value = value == "fp8"
        values.append(value)
    return values


def number_text(value: int | float) -> str:
    """A number as the form's text box shows it: exact (repr round-trips a float), no grouping."""
    return str(value) if isinstance(value, int) else repr(float(value))


def error_text(exc: SpecError, lang: str) -> str:
    """A refused config in the page's language: "<label> (<key>): <why>"."""
    if isinstance(exc, FieldError):   # a `reason` param is a jobs/ sentence (e.g. a refused .zip): translated too
        params = {k: translated(v, lang) if k == "reason" else v for k, v in exc.params.items()}
        why = t(f"error.{exc.code}", lang, **params)
    else:
        why = translated(str(exc).removeprefix(f"{exc.key}: ") if exc.key else str(exc), lang)
    if not exc.key:
        return why
    label = field_label(exc.key, lang) if exc.key in JobSpec.__dataclass_fields__ else exc.key
    return t("error.field", lang, label=label, key=exc.key, message=why)
