"""Start and the fit check of the Train tab: what the user sees of studio/start_check.py.

Start: the form's values -> the read policy and JobSpec -> the preflight (`--dry-run`'s) -> the fit
check -> the runner. A refusal at any step queues nothing and names the field or the rows. A job
predicted not to fit on its GPU is not queued on the first press: the status says why and the
button becomes "Start anyway"; pressing it again for the same config queues it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import gradio as gr

from jobs.spec import JobSpec, SpecError
from studio import form, render
from studio.i18n import t
from studio.start_check import FitView, StartCheck, Verdict

# The fields the fit check reads (jobs/models/fit.py); a change in any of them redraws it.
FIT_FIELDS = ("model", "load_in_4bit", "fused_kernels", "base_precision", "gradient_checkpointing", "packing",
              "dtype", "gpus", "lora_r", "target_modules", "batch_size", "max_seq_length", "max_gpu_memory_gb",
              # and on a CPU the time estimate (jobs/models/step_time.py) reads these
              "max_steps", "num_epochs", "gradient_accumulation_steps", "dataset")


@dataclass
class StartResult:
    status: str          # HTML for the status box
    job_id: str = ""     # the job queued, "" when none
    confirm: str = ""    # the config the user was warned about (Start then means "Start anyway")
    fit: str | None = None   # a fresh fit-check HTML when Start computed one


def confirm_key(spec: JobSpec) -> str:
    return hashlib.sha1(spec.to_yaml().encode()).hexdigest()


def start_job(runner: Any, check: StartCheck, names: list[str], values: list[Any], lang: str = "en",
              confirmed: str = "") -> StartResult:
    try:
        spec = check.spec(names, values)
    except SpecError as exc:
        return _refused(t("train.not_started", lang, error=form.error_text(exc, lang)))
    verdict = check.preflight(spec)
    if not verdict.ok:
        return _refused(preflight_text(verdict, lang))
    view = check.fit(spec, verdict.model_source)
    fit = fit_html(spec, view, lang)
    if not view.fits and confirmed != confirm_key(spec):
        message = t("train.fit_confirm", lang, need=f"{view.estimate.total_gb:.1f}", gpu=view.gpu,
                    free=f"{view.free_gb:.1f}")
        gr.Warning(message)
        return StartResult(render.notice_html(message, "warn"), confirm=confirm_key(spec), fit=fit)
    try:
        record = runner.submit(spec, need_gb=_need_gb(view))
    except SpecError as exc:
        return _refused(t("train.not_started", lang, error=form.error_text(exc, lang)))
    except OSError as exc:  # a full or read-only disk (jobs.io.storage.StorageError): its one line says so
        return _refused(t("train.not_started", lang, error=str(exc)))
    return StartResult(render.notice_html(t("train.started", lang, job=record.id, name=record.name), "ok"),
                       job_id=record.id, fit=fit)


def _need_gb(view: FitView) -> float | None:
    """What the queue waits for on the GPU: the fit check's predicted peak (None on a CPU machine
    or for a model it cannot size: the job then waits for a whole GPU)."""
    return None if view.on_cpu or view.estimate is None else view.estimate.total_gb


def _refused(message: str) -> StartResult:
    gr.Warning(message)
    return StartResult(render.notice_html(message, "error"))


def preflight_text(verdict: Verdict, lang: str) -> str:
    """The refusal: how many problems, then each naming its field in the page's language (the
    messages themselves, with row numbers and file names, are the preflight's own)."""
    lines = [t("train.preflight_failed", lang, count=len(verdict.problems))]
    lines += [f"• {form.error_text(SpecError(key, message), lang)}" for key, message in verdict.problems]
    return "\n".join(lines)


def fit_html(spec: JobSpec | None, view: FitView | None, lang: str) -> str:
    """The fit check beside Start: predicted peak GPU memory against the chosen GPU's free memory."""
    if spec is None or view is None:
        return ""
    if view.on_cpu:
        return cpu_fit_html(view, lang)
    if view.estimate is None:
        return render.notice_html(t("fit.unknown", lang, gpu=view.gpu, free=f"{view.free_gb:.1f}"), "info")
    numbers = {"need": f"{view.estimate.total_gb:.1f}", "gpu": view.gpu, "free": f"{view.free_gb:.1f}",
               "checkpointing": view.estimate.checkpointing}
    from jobs.models.fit import advice
    if view.estimate.over_budget:
        return render.notice_html(t("fit.over_budget", lang, budget=f"{spec.max_gpu_memory_gb:g}",
                                    tips="; ".join(advice(spec, view.estimate)), **numbers), "warn")
    if view.fits:
        return render.notice_html(t("fit.fits", lang, **numbers), "ok")
    tips = "; ".join(advice(spec, view.estimate))
    return render.notice_html(t("fit.too_big", lang, tips=tips, **numbers), "warn")


def cpu_fit_html(view: FitView, lang: str) -> str:
    """On a machine without a GPU: the RAM the job needs against this machine's RAM."""
    import psutil
    if view.estimate is None:
        return render.notice_html(t("fit.cpu", lang), "info")
    memory = psutil.virtual_memory()
    # the estimate counts the Python process itself too (jobs/models/fit_cpu.py)
    numbers = {"need": f"{view.estimate.allocated_gb:.1f}",
               "available": f"{memory.available / 2 ** 30:.1f}", "total": f"{memory.total / 2 ** 30:.1f}"}
    duration = cpu_time_text(view.time, lang)
    if view.estimate.allocated_gb > memory.available / 2 ** 30:
        return render.notice_html(t("fit.cpu_ram_short", lang, **numbers) + duration, "warn")
    return render.notice_html(t("fit.cpu_ram", lang, **numbers) + duration, "info")


def cpu_time_text(estimate: Any, lang: str) -> str:
    """A line "About 12 min on this CPU: ...": the measured step scaled to the job; "" when unknown."""
    if estimate is None:
        return ""
    minutes = estimate.seconds / 60
    shown = f"{minutes:.0f}" if minutes >= 10 else f"{max(minutes, 0.1):.1f}"
    step = f"{estimate.step_seconds:.3g}" if estimate.step_seconds < 100 else f"{estimate.step_seconds:.0f}"
    return "\n" + t("fit.cpu_time" if estimate.rows_measured else "fit.cpu_time_at_most", lang, minutes=shown,
                    steps=f"{estimate.steps:,}", step=step, tokens=estimate.tokens_per_row)


def fit_for_form(check: StartCheck, names: list[str], values: list[Any], lang: str) -> str:
    """The fit check for the form as it is; nothing while the form itself is refused (the command
    box says why)."""
    try:
        spec = check.spec(names, values)
    except SpecError:
        return ""
    return vision_html(check.vision_kind(spec), lang) + fit_html(spec, check.fit(spec), lang)


def vision_html(kind: tuple[str, str] | None, lang: str) -> str:
    """The model picker's word on a vision-language model: what it trains on, or why it cannot."""
    if kind is None:
        return ""
    status, detail = kind
    if status == "refused":
        return render.notice_html(t("fit.vision_refused", lang, reason=detail), "warn")
    return render.notice_html(t("fit.vision", lang, family=detail), "info")
