"""What the server serves: the jobs' common base model, loaded once, with each job's LoRA adapter
loaded beside the others on it (PEFT multi-adapter: `load_adapter` per job, `set_adapter` per batch,
as vLLM/ms-swift serve several LoRAs over one base), and each model id's own tokenizer.

Model ids: the base by its own name (the job's `model` as written: a hub id, `builtin:...`, or a
local folder's name), each adapter by its job folder's name."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from jobs.export.files import ExportError
from jobs.export.job_config import exported_spec
from jobs.export.source import locate_base
from jobs.io.events import summarize
from jobs.io.layout import JobLayout
from jobs.models.load import ModelError, load_base_model, load_tokenizer, max_positions

DEFAULT_CONTEXT = 2048   # a model whose config names no length


class ServeError(Exception):
    """A job that cannot be served, said in one line for the operator."""


@dataclass
class ServedModel:
    """One model id: the PEFT adapter name to switch on (None: the base, adapters off)."""

    id: str
    adapter: str | None
    tokenizer: object
    owned_by: str


@dataclass
class Served:
    model: torch.nn.Module
    base_dir: Path
    context: int
    models: dict[str, ServedModel] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def base_name(model: str) -> str:
    """The base's own name: a hub id or `builtin:...` as written, a local folder by its name."""
    path = Path(model).expanduser()
    return path.name if path.name and (path.exists() or model.startswith(("/", "./", "../", "~"))) else model


def _job_base(job_dir: Path, data_dir, log) -> tuple[str, Path, Path]:
    """(base model name, base folder, adapter folder) of one finished job."""
    layout = JobLayout(job_dir)
    try:
        spec = exported_spec(job_dir)
        if not layout.has_adapter():
            raise ServeError(f"{job_dir} has no trained adapter ({layout.adapter}/): let the job finish first")
        base_dir = locate_base(spec, (summarize(job_dir).start or {}).get("source"), data_dir, log)
    except ExportError as exc:
        raise ServeError(str(exc)) from None
    return base_name(spec.model), base_dir, layout.adapter


def _tokenizer(folder: Path, fallback: Path):
    has_own = (folder / "tokenizer_config.json").is_file()
    return load_tokenizer(str(folder if has_own else fallback))


def load_served(job_dirs: list[str | Path], data_dir=None, log=print) -> Served:
    """Load the common base once and every job's adapter on it; ServeError when the jobs' bases differ,
    two jobs share a folder name, or a job/model cannot be read."""
    jobs = [Path(d).resolve() for d in job_dirs]
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ServeError(f"two jobs are both named {sorted({n for n in names if names.count(n) > 1})[0]!r}: "
                         "model ids are job folder names, so serve jobs with different folder names")
    found = [_job_base(j, data_dir, log) for j in jobs]
    bases = {str(base_dir.resolve()) for _, base_dir, _ in found}
    if len(bases) > 1:
        raise ServeError("these jobs were trained on different base models (" + ", ".join(sorted(bases)) +
                         "): serve the jobs of one base model per server")
    base_id, base_dir, _ = found[0]
    if base_id in names:
        raise ServeError(f"a job folder is named like its base model ({base_id!r}): rename the folder")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        model = _with_adapters(load_base_model(str(base_dir), dtype, device), [a for _, _, a in found])
        served = Served(model=model, base_dir=base_dir, context=max_positions(model.config) or DEFAULT_CONTEXT)
        served.models[base_id] = ServedModel(base_id, None, _tokenizer(base_dir, base_dir), "fusetune")
        for index, (job, (_, _, adapter)) in enumerate(zip(jobs, found)):
            served.models[job.name] = ServedModel(job.name, f"job{index}", _tokenizer(adapter, base_dir), base_id)
    except (ModelError, OSError, ValueError) as exc:
        raise ServeError(f"could not load the model: {exc}") from None
    return served


def _with_adapters(base, adapters: list[Path]):
    """A PeftModel holding every adapter, named job0, job1, ... (a folder name may hold characters a
    module name cannot), in eval mode."""
    from peft import PeftModel
    model = PeftModel.from_pretrained(base, str(adapters[0]), adapter_name="job0")
    for index, adapter in enumerate(adapters[1:], start=1):
        model.load_adapter(str(adapter), adapter_name=f"job{index}")
    model.eval()
    return model
