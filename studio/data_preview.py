"""The Train tab's data preview: the first rows as the job will read them, or a box naming what is wrong."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.spec import BUILTIN_DATASET, PREFERENCE_METHODS, JobSpec, SpecError
from studio import form, render
from studio.i18n import t
from studio.server_text import translated


def preview_data(data_dir: Path, names: list[str], values: list[Any], lang: str = "en") -> str:
    """The preview HTML, or an error box naming what is wrong (spec field, file/row/field)."""
    from jobs.data import dataset as data  # loads a tokenizer: imported on first use, not with the UI
    from jobs.checks.access import DataAccess
    try:
        access = DataAccess.for_studio(data_dir)
        spec = JobSpec.from_dict(access.check_values(form.values_to_dict(names, values)))
        if spec.method in PREFERENCE_METHODS:
            from jobs.data.pair_preview import preview_preference
            from studio.pair_render import pairs_html
            return pairs_html(preview_preference(spec, n=3, data_dir=data_dir, access=access), lang)
        vision_preview = _vision_preview(spec, data_dir)
        if vision_preview is not None:   # image-text rows: thumbnails beside the text
            return render.preview_html(vision_preview, lang)
        preview = data.preview_rows
        if spec.method == "grpo":   # prompts as the model sees them, and the columns the rewards get
            from jobs.data.prompts import preview_rows as preview
        shown = render.preview_html(preview(spec, n=3, data_dir=data_dir, access=access), lang)
        if spec.dataset == BUILTIN_DATASET and spec.method == "sft":  # the rows the job trains, not only the 3 shown
            shown = render.identity_count_html(*data.identity_row_counts(spec, data_dir), lang) + shown
        return shown
    except SpecError as exc:
        return render.notice_html(form.error_text(exc, lang), "error")
    except data.DataError as exc:
        return render.notice_html(translated(str(exc), lang), "error")
    except Exception as exc:  # model load failures etc.: show them, the form stays usable
        return render.notice_html(t("train.preview_failed", lang, error=f"{type(exc).__name__}: {exc}"), "error")


def _vision_preview(spec: JobSpec, data_dir: Path) -> list[dict] | None:
    """The preview rows of a vision-language model's data (jobs/data/vision_preview.py); None for a text model."""
    from jobs.models import load as models
    from jobs.models import vision
    source = models.resolve_model(spec.model, data_dir, log=lambda _line: None)
    if not vision.is_vision_config(models.load_config(source)):
        return None
    from jobs.data.vision_preview import preview_vision_rows
    return preview_vision_rows(spec, source, n=3, data_dir=data_dir)
