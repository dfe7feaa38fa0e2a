"""What an export reads: the job's spec, its LoRA adapter, and the base model's safetensors shards.

Only the adapter (megabytes) is loaded whole; base tensors are described from the shard headers
and read one shard at a time by the writers (safetensors' `safe_open`)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from jobs.messages import say
from jobs.io.events import summarize
from jobs.export.files import ExportError
from jobs.export.job_config import exported_spec
from jobs.io.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS, JobLayout
from jobs.spec import JobSpec

PEFT_PREFIX = "base_model.model."


@dataclass
class LoraPair:
    """One LoRA update of a base weight: delta = scale * B @ A."""

    a: torch.Tensor  # (r, in_features)
    b: torch.Tensor  # (out_features, r)
    scale: float

    def delta(self, device: torch.device | str = "cpu") -> torch.Tensor:
        a, b = self.a.to(device, torch.float32), self.b.to(device, torch.float32)
        return (b @ a) * self.scale


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    shard: Path


@dataclass
class JobSource:
    job_dir: Path
    spec: JobSpec
    adapter_dir: Path
    base_dir: Path
    config: dict
    lora: dict[str, LoraPair]
    lora_alpha: float
    tensors: list[TensorSpec] = field(default_factory=list)
    train_dtype: str | None = None
    device: str = "auto"  # where deltas are computed: auto (GPU if any), cpu or cuda

    @property
    def qlora(self) -> bool:
        return bool(self.spec.load_in_4bit)

    @property
    def shards(self) -> list[Path]:
        """The base's shard files in the order their tensors are listed."""
        return list(dict.fromkeys(t.shard for t in self.tensors))

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or [self.config.get("model_type", "?")])[0]


def load_job(job_dir: str | Path, data_dir: str | Path | None = None, log=print) -> JobSource:
    """Everything an export needs from a finished job, or an ExportError saying what is missing."""
    layout = JobLayout(Path(job_dir))
    spec = exported_spec(layout.root)
    if not layout.has_adapter():
        raise ExportError(say("export_no_adapter", job=layout.root.name, missing=ADAPTER_WEIGHTS))
    start = summarize(layout.root).start or {}
    base_dir = locate_base(spec, start.get("source"), data_dir, log)
    config = json.loads((base_dir / "config.json").read_text(encoding="utf-8"))
    lora, alpha = read_lora(layout.adapter)
    source = JobSource(job_dir=layout.root, spec=spec, adapter_dir=layout.adapter, base_dir=base_dir,
                       config=config, lora=lora, lora_alpha=alpha, tensors=describe_tensors(base_dir),
                       train_dtype=start.get("dtype"))
    source.lora = on_disk_names(source.lora, {t.name for t in source.tensors})
    missing = sorted(set(source.lora) - {t.name for t in source.tensors})
    if missing:
        raise ExportError(say("export_tensor_not_in_base", tensor=missing[0], base=base_dir))
    return source


def locate_base(spec: JobSpec, started_from: str | None, data_dir, log) -> Path:
    """A local folder with the base's config.json and safetensors: where the job loaded it from if
    that still exists, else resolved again (the built-in model or a GGUF is converted once)."""
    if started_from and (Path(started_from) / "config.json").is_file():
        return Path(started_from)
    from jobs.models.load import ModelError, resolve_model
    try:
        resolved = resolve_model(spec.model, data_dir, log=log)
    except ModelError as exc:
        raise ExportError(say("export_base_missing", problem=exc)) from None
    if (Path(resolved) / "config.json").is_file():
        return Path(resolved)
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(resolved, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises several kinds for "not downloaded"
        raise ExportError(say("export_base_not_here", model=resolved, kind=type(exc).__name__)) from None


def _shard_files(base_dir: Path) -> list[Path]:
    index = base_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [base_dir / name for name in dict.fromkeys(sorted(set(weight_map.values())))]
    single = base_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise ExportError(say("export_no_safetensors", folder=base_dir))


def describe_tensors(base_dir: Path) -> list[TensorSpec]:
    """Name, shape and dtype of every base tensor, from the shard headers (no tensor data read)."""
    from safetensors import safe_open
    specs: list[TensorSpec] = []
    for shard in _shard_files(base_dir):
        with safe_open(str(shard), framework="pt") as reader:
            for name in reader.keys():
                view = reader.get_slice(name)
                specs.append(TensorSpec(name, tuple(view.get_shape()), _DTYPES[view.get_dtype()], shard))
    return specs


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


# transformers 5 loads Qwen2-VL/Qwen2.5-VL checkpoints as model.language_model.* and model.visual.*, but
# saves and ships them as model.* and visual.* (its checkpoint conversion mapping): the adapter names the
# loaded modules, the base folder's tensors the saved ones
VISION_LANGUAGE_RENAMES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def on_disk_names(lora: dict, names: set[str]) -> dict:
    """The adapter's weight names as the base folder's tensors spell them (see VISION_LANGUAGE_RENAMES)."""
    out = {}
    for name, pair in lora.items():
        if name not in names:
            for loaded, saved in VISION_LANGUAGE_RENAMES:
                if name.startswith(loaded) and saved + name[len(loaded):] in names:
                    name = saved + name[len(loaded):]
                    break
        out[name] = pair
    return out


def read_lora(adapter_dir: Path) -> tuple[dict[str, LoraPair], float]:
    """{base weight name: LoraPair} from a PEFT adapter folder, and its lora_alpha."""
    from safetensors.torch import load_file
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    refuse = [key for key in ("use_dora", "alpha_pattern", "rank_pattern", "modules_to_save") if config.get(key)]
    if refuse:
        raise ExportError(say("export_adapter_option", option=refuse[0]))
    alpha = float(config["lora_alpha"])
    weights = load_file(str(adapter_dir / ADAPTER_WEIGHTS))
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        name = key.removeprefix(PEFT_PREFIX)
        for part in ("lora_A", "lora_B"):
            marker = f".{part}.weight"
            if name.endswith(marker):
                halves.setdefault(name[: -len(marker)] + ".weight", {})[part] = tensor
                break
        else:
            raise ExportError(say("export_adapter_odd_tensor", tensor=key))
    pairs = {}
    for name, half in halves.items():
        if set(half) != {"lora_A", "lora_B"}:
            raise ExportError(say("export_lora_half", tensor=name, halves=", ".join(half)))
        rank = half["lora_A"].shape[0]
        scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        pairs[name] = LoraPair(half["lora_A"], half["lora_B"], scale)
    return pairs, alpha
