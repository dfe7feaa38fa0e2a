"""`--format adapter`: the PEFT adapter folder as a zip, with a portable adapter_config.json."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

from jobs.messages import say
from jobs.export.card import BASE_MODEL_KEY, portable_base_model
from jobs.export.files import ExportError, atomic_output
from jobs.export.job_config import exported_spec
from jobs.io.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS, JobLayout

REQUIRED = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)


def default_zip_path(job_dir: Path) -> Path:
    return Path(job_dir) / f"{Path(job_dir).name}-adapter.zip"


def _portable_config(config_file: Path, job_dir: Path) -> bytes:
    """adapter_config.json with base_model_name_or_path as another machine can load it (adapters
    saved before that rewrite existed still point at this machine's model cache)."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    try:
        model = exported_spec(job_dir).model
    except (OSError, ExportError):
        return config_file.read_bytes()
    config[BASE_MODEL_KEY] = portable_base_model(model)
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")


def export_adapter_zip(job_dir: str | Path, out: str | Path | None = None) -> Path:
    """Zip the job's adapter folder (the PEFT dir with tokenizer and card) to <job>/<id>-adapter.zip."""
    job_dir = Path(job_dir)
    adapter = JobLayout(job_dir).adapter
    missing = [name for name in REQUIRED if not (adapter / name).is_file()]
    if missing:
        raise ExportError(say("export_no_adapter", job=job_dir.name, missing=", ".join(missing)))
    target = Path(out) if out else default_zip_path(job_dir)
    with atomic_output(target, folder=False) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for file in sorted(adapter.rglob("*")):
                if not file.is_file():
                    continue
                arcname = f"adapter/{file.relative_to(adapter)}"
                if file.name == ADAPTER_CONFIG and file.parent == adapter:
                    zf.writestr(arcname, _portable_config(file, job_dir))
                else:
                    zf.write(file, arcname=arcname)
    return target
