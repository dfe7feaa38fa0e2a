"""The one way an export reads a job's config.yaml: every value checked, the files only a start
reads (data, reward file, resume checkpoint) not looked for. An export needs the base model, the
adapter and the tokenizer; a reward file moved away after training must not stop it."""
from __future__ import annotations

from pathlib import Path

from jobs.export.files import ExportError
from jobs.io.layout import JobLayout
from jobs.messages import say
from jobs.spec import JobSpec, SpecError


def exported_spec(job_dir: str | Path) -> JobSpec:
    """The spec the job ran with; ExportError naming the folder, or config.yaml and the bad field."""
    config = JobLayout(Path(job_dir)).config
    if not config.is_file():
        raise ExportError(say("export_not_job_folder", folder=Path(job_dir), config=config.name))
    try:
        return JobSpec.from_yaml(config, to_run=False)
    except SpecError as exc:
        raise ExportError(say("export_config_refused", config_file=config, problem=exc)) from None
