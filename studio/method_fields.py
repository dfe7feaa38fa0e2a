"""The Train tab's method picker: which method-specific fields show, the built-in dataset that fits
the method, and beta following the method's default (JobSpec METHOD_DEFAULTS) until the user types one."""
from __future__ import annotations

from typing import Any

import gradio as gr

from jobs.spec import (BUILTIN_CONCISE, BUILTIN_DATASET, BUILTIN_PROMPT_DATASETS, BUILTIN_SHAPES, DATASET_DEFAULTS,
                       METHOD_DEFAULTS, PREFERENCE_METHODS, JobSpec)
from studio import form

ARITHMETIC = BUILTIN_PROMPT_DATASETS[0]


def builtin_for(method: str, dataset: str) -> str | None:
    """The built-in dataset to switch to when the method changes, or None to keep `dataset`: a
    built-in set of another method's kind gives way to this method's (identity for sft, concise for
    a preference method, arithmetic for grpo), so Start works on built-ins alone; an uploaded file is
    the user's pick, and sft keeps builtin:shapes (image-text SFT)."""
    wanted = (BUILTIN_CONCISE if method in PREFERENCE_METHODS else ARITHMETIC if method == "grpo"
              else BUILTIN_DATASET)
    swappable = {BUILTIN_DATASET, BUILTIN_CONCISE, ARITHMETIC} | ({BUILTIN_SHAPES} if method != "sft" else set())
    return wanted if dataset in swappable and dataset != wanted else None


def method_updates(method: str, dataset: str, keys: list[str], beta: Any = None) -> list[Any]:
    """Updates for [preference group, *its fields, dataset] when the method changes: the group and
    the keys this method reads are shown; a built-in dataset of another kind is swapped for the one
    that fits (`builtin_for`), an uploaded one is kept.
    beta still at the other kind's default follows the method (grpo 0.0, the others 0.1:
    JobSpec's METHOD_DEFAULTS); a beta the user typed is kept."""
    used = form.preference_keys(method)
    swap = builtin_for(method, (dataset or "").strip())
    return [gr.update(visible=bool(used)),
            *[gr.update(visible=key in used, **_beta_value(method, beta) if key == "beta" else {}) for key in keys],
            gr.update(value=swap) if swap else gr.skip()]


def _beta_value(method: str, beta: Any) -> dict:
    general = JobSpec.__dataclass_fields__["beta"].default
    wanted = METHOD_DEFAULTS.get(method, {}).get("beta", general)
    defaults = {general, *(d["beta"] for d in METHOD_DEFAULTS.values() if "beta" in d)}
    try:
        current = float(str(beta).strip())
    except (TypeError, ValueError):
        return {}
    return {"value": form.number_text(wanted)} if current in defaults and current != wanted else {}


def dataset_default_update(key: str, dataset: str, current: Any) -> Any:
    """An update of field `key` (e.g. learning_rate) when the dataset changes: a value still at
    another dataset's default follows this dataset's (JobSpec DATASET_DEFAULTS: builtin:identity
    trains at 4e-4, the rest at the field's own default), as beta follows the method; a typed one stays."""
    general = JobSpec.__dataclass_fields__[key].default
    wanted = DATASET_DEFAULTS.get((dataset or "").strip(), {}).get(key, general)
    defaults = {general, *(d[key] for d in DATASET_DEFAULTS.values() if key in d)}
    try:
        value = float(str(current).strip())
    except (TypeError, ValueError):
        return gr.skip()
    return gr.update(value=form.number_text(wanted)) if value in defaults and value != wanted else gr.skip()


def wire_method(made: dict[str, Any]) -> Any:
    """The method picker's event (None without the preference group): callers chain what must see
    its swapped dataset and beta (`.then`: inputs read once they are on the page)."""
    box = made.get("group.preference")
    if box is None:
        return None
    keys = [widget.name for widget in dict(form.grouped_widgets())["preference"]]
    return made["method"].change(lambda method, dataset, beta: method_updates(method, dataset, keys, beta),
                          [made["method"], made["dataset"], made["beta"]],
                          [box, *[made[k] for k in keys], made["dataset"]], show_progress="hidden")
