"""Exporting a finished job: the PEFT adapter zip (plus a llama.cpp LoRA GGUF), a merged Hugging Face
folder, or a GGUF file with an Ollama Modelfile. `python -m jobs.export --help` is the CLI.

This module stays light (the trainer imports `model_card` from it); the writers are imported when
an export runs."""
from __future__ import annotations

from pathlib import Path

from jobs.export.adapter import default_zip_path, export_adapter_zip
from jobs.export.busy import exporting
from jobs.export.card import model_card
from jobs.export.files import ExportError, ExportResult, Progress, no_progress
from jobs.export.job_config import exported_spec
from jobs.io.layout import JobLayout
from jobs.messages import say
from jobs.spec import short_name

FORMATS = ("adapter", "merged", "gguf")
QUANTS = ("f16", "bf16", "q8_0")

__all__ = ["FORMATS", "QUANTS", "ExportError", "ExportResult", "export", "export_adapter_zip",
           "model_card", "default_output", "list_exports", "estimate_sizes"]


def _stem(job_dir: Path) -> str:
    try:
        return f"{short_name(exported_spec(job_dir).model)}-ft"
    except (OSError, ValueError, ExportError):
        return job_dir.name


def default_output(job_dir: str | Path, fmt: str, quant: str = "f16") -> Path:
    """Where an export goes unless --out says otherwise (inside the job's exports/ folder)."""
    job_dir = Path(job_dir)
    if fmt == "adapter":
        return default_zip_path(job_dir)
    if fmt == "merged":
        return JobLayout(job_dir).exports / f"{_stem(job_dir)}-merged"
    return JobLayout(job_dir).exports / f"{_stem(job_dir)}-{quant}" / f"{_stem(job_dir)}-{quant}.gguf"


def export(job_dir: str | Path, fmt: str, quant: str = "f16", out: str | Path | None = None,
           data_dir: str | Path | None = None, progress: Progress = no_progress, log=print,
           device: str = "auto") -> ExportResult:
    """Run one export; raises ExportError with a message for people. `device` is where the merge
    runs (auto: the GPU if there is one, which also makes the merged weights bf16)."""
    if fmt not in FORMATS:
        raise ExportError(say("export_format_unknown", value=fmt, choices=", ".join(FORMATS)))
    if quant not in QUANTS:
        raise ExportError(say("export_quant_unknown", value=quant, choices=", ".join(QUANTS)))
    job_dir = Path(job_dir)
    target = Path(out).expanduser() if out else default_output(job_dir, fmt, quant)
    with exporting(job_dir):  # the job cannot be deleted meanwhile (jobs/export/busy.py)
        return _export(job_dir, fmt, quant, target, data_dir, progress, log, device)


def _export(job_dir: Path, fmt: str, quant: str, target: Path, data_dir, progress: Progress, log,
            device: str) -> ExportResult:
    if fmt == "adapter":
        from jobs.export.lora_gguf import export_adapter
        return export_adapter(job_dir, target, data_dir, progress, log)
    from jobs.export.source import load_job
    progress(0.0, "reading the job, its adapter and the base model's shard headers")
    source = load_job(job_dir, data_dir, log=log)
    source.device = device
    if fmt == "merged":
        from jobs.export.merge import export_merged
        folder, notes = export_merged(source, target, progress)
        return ExportResult([folder], notes)
    from jobs.export.to_gguf import export_gguf
    return export_gguf(source, target, quant, progress)


def list_exports(job_dir: str | Path) -> list[Path]:
    """The models exported to a job's exports/ folder that a model box can load: merged folders
    (they have a config.json) and GGUF files."""
    root = JobLayout(Path(job_dir)).exports
    if not root.is_dir():
        return []
    found = (sorted(p.parent for p in root.glob("*/config.json")) + sorted(root.glob("*/*.gguf"))
             + sorted(root.glob("*.gguf")))
    # never an unfinished export: those live under hidden names (.<name>.partial-<pid>, jobs/export/files.py)
    return [p for p in found if not any(part.startswith(".") for part in p.relative_to(root).parts)]


def estimate_sizes(job_dir: str | Path, data_dir: str | Path | None = None) -> dict[str, int]:
    """Bytes each export would write ("merged", "gguf f16", ...), from the base's shard headers;
    empty when the base cannot be found. No tensor is read."""
    from jobs.export import families, merge, to_gguf
    from jobs.export.source import load_job
    try:
        source = load_job(job_dir, data_dir, log=lambda _line: None)
    except ExportError:
        return {}
    device = merge.merge_device()
    sizes = {"merged": sum(merge.output_bytes(t, device) for t in source.tensors)}
    try:
        family = families.family_of(source.config)
    except ExportError:
        return sizes
    for quant in QUANTS:
        sizes[f"gguf {quant}"] = sum(entry.nbytes for entry in to_gguf.plan(source, family, quant))
    return sizes
