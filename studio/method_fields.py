"""The Train tab's method picker: which method-specific fields show, the built-in dataset that fits
the method, and beta following the method's default (JobSpec METHOD_DEFAULTS) until the user types one."""
from __future__ import annotations

from typing import Any

import gradio as gr

from jobs.spec import BUILTIN_CONCISE, BUILTIN_DATASET, METHOD_DEFAULTS, PREFERENCE_METHODS, JobSpec
from studio import form


def method_updates(method: str, dataset: str, keys: list[str], beta: Any = None) -> list[Any]:
    """Updates for [preference group, *its fields, dataset] when the method changes: the group and
    the keys this method reads are shown; a built-in dataset of the other kind is swapped for the
    one that fits (identity for sft, concise for a preference method), an uploaded one is kept.
    beta still at the other kind's default follows the method (grpo 0.0, the others 0.1:
    JobSpec's METHOD_DEFAULTS); a beta the user typed is kept."""
    preference = method in PREFERENCE_METHODS
    used = form.preference_keys(method)
    dataset = (dataset or "").strip()
    swap = {BUILTIN_DATASET: BUILTIN_CONCISE} if preference else {BUILTIN_CONCISE: BUILTIN_DATASET}
    return [gr.update(visible=bool(used)),
            *[gr.update(visible=key in used, **_beta_value(method, beta) if key == "beta" else {}) for key in keys],
            gr.update(value=swap[dataset]) if dataset in swap else gr.skip()]


def _beta_value(method: str, beta: Any) -> dict:
    general = JobSpec.__dataclass_fields__["beta"].default
    wanted = METHOD_DEFAULTS.get(method, {}).get("beta", general)
    defaults = {general, *(d["beta"] for d in METHOD_DEFAULTS.values() if "beta" in d)}
    try:
        current = float(str(beta).strip())
    except (TypeError, ValueError):
        return {}
    return {"value": form.number_text(wanted)} if current in defaults and current != wanted else {}


def wire_method(made: dict[str, Any]) -> None:
    box = made.get("group.preference")
    if box is None:
        return
    keys = [widget.name for widget in dict(form.grouped_widgets())["preference"]]
    made["method"].change(lambda method, dataset, beta: method_updates(method, dataset, keys, beta),
                          [made["method"], made["dataset"], made["beta"]],
                          [box, *[made[k] for k in keys], made["dataset"]], show_progress="hidden")
