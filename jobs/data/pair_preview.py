"""The first preference rows of a job's dataset as the model sees them (the Train tab's pair preview).

The rows are read as training reads them (an uploaded file's first rows only, or builtin:concise
from the base model's cached answers); jobs/data/preference.py's preview_pairs renders them with
the model's chat template."""
from __future__ import annotations

from jobs.data.conversation import DataError
from jobs.messages import say
from jobs.spec import BUILTIN_CONCISE, JobSpec


def preview_preference(spec: JobSpec, n: int = 3, data_dir=None, access=None) -> list[dict]:
    """preview_pairs of spec.dataset's first n rows: {prompt, chosen, rejected} (KTO: {prompt,
    completion, label}) strings, {error} for a row that cannot be read. With `access` (the
    studio's), the dataset and model must be ones the studio may read."""
    from jobs.data import dataset as data
    from jobs.data import encode
    from jobs.data.preference import csv_rows, preview_pairs
    from jobs.models import load as models
    if access is not None:
        spec = access.check_spec(JobSpec.from_dict(spec.to_dict()))
    source = models.resolve_model(spec.model, data_dir, log=lambda _line: None)
    tokenizer = models.load_tokenizer(source)
    encode.ensure_chat_template(tokenizer)
    if spec.dataset == BUILTIN_CONCISE:
        rows = data.load_rows(spec, data_dir, log=lambda _line: None)  # cached answers only: never generates
    else:
        rows, problems = data.scan_rows(spec.dataset, first=n)
        error = problems.error(rows.name)
        if error:
            raise error
    if not rows:
        raise DataError(say("no_pair_rows", name=rows.name))
    return preview_pairs(list(rows[:n]), tokenizer, spec.max_seq_length, n, text_labels=csv_rows(rows))
