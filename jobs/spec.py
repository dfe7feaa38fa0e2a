"""JobSpec: the one typed description of a training job.

The same dataclass feeds the studio's Train form, the YAML file a job runs from and the
``python -m jobs.train`` command line (the idea of one args dataclass for all three comes from
litgpt's ``args.py``). Each field carries its help text in ``metadata["help"]``; validation names
the offending key and says how to fix it, and runs before anything is loaded.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BUILTIN_MODEL = "builtin:smollm2-135m-instruct"
BUILTIN_DATASET = "builtin:identity"
# the built-in preference set (jobs/data/builtin/concise.py): the base model's answers, short one preferred
BUILTIN_CONCISE = "builtin:concise"
BUILTIN_DATASETS = (BUILTIN_DATASET, BUILTIN_CONCISE)
DATASET_FORMATS = ("auto", "alpaca", "sharegpt", "messages", "text")
DTYPES = ("auto", "bf16", "fp16", "fp32")
CHECKPOINTING = ("auto", "on", "off", "offload")
PACKING = ("auto", "on", "off")
BASE_PRECISIONS = ("bf16", "fp8")
DATASET_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")
# training methods (jobs/train/methods/): each new one adds its name here and its class there
METHODS = ("sft", "dpo", "orpo", "simpo", "kto")
PREFERENCE_METHODS = ("dpo", "orpo", "simpo", "kto")
REFERENCE_FREE_METHODS = ("orpo", "simpo")
MODULE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")


# owner/name as the Hub spells it: letters, digits, '-', '_' and '.', not starting or ending with
# '-' or '.', at most 96 characters each; '..' anywhere is refused by hub_id_problem.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HUB_ID = re.compile(rf"{_PART}/{_PART}")


def hub_id_problem(value: str) -> str | None:
    """Why `value` is not a usable hub id (None when it is one): the strict owner/name shape, and
    never the name of something on this machine."""
    if not HUB_ID.fullmatch(value) or ".." in value:
        return (f"{value!r} is not a hub id: a hub id looks like owner/name (letters, digits, '-', '_', "
                "'.'); a file must be uploaded or picked from the list")
    if os.path.lexists(value):
        return (f"{value!r} names a local path, which is never read as a hub id; upload the data file "
                "or give a hub id that is not a local folder name")
    return None


def is_local_reference(value: str, suffixes: tuple[str, ...]) -> bool:
    """A path (absolute, ~, ./ or ../, or ending in one of `suffixes`) rather than a hub id."""
    return value.startswith(("/", "~", ".", "\\")) or Path(value).suffix.lower() in suffixes


def short_name(value: str) -> str:
    """The last component of a model or dataset reference: builtin:identity -> identity,
    /models/tiny/ -> tiny, org/model -> model, ~/x.gguf -> x (for job names and folders)."""
    return value.split(":")[-1].rstrip("/").split("/")[-1].removesuffix(".gguf")


class SpecError(ValueError):
    """A refused job config. ``key`` names the offending field (None for the whole file)."""

    def __init__(self, key: str | None, message: str):
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


def _f(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its help text (and optional choices / bounds) in metadata."""
    meta = {"help": help, **extra}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class JobSpec:
    """Everything a training job needs. Defaults are the built-in CPU quick start."""

    name: str = _f("", "The job's display name (empty: model · dataset, plus the bot name for identity jobs).")
    model: str = _f(BUILTIN_MODEL, "Base model: a hub id, a local Hugging Face folder, a .gguf file, "
                    f"or {BUILTIN_MODEL} (ships with Fusetune, runs offline).")
    method: str = _f("sft", "Training method: sft (supervised fine-tuning on answers), or preference tuning on "
                     "chosen/rejected pairs: dpo, orpo, simpo, or kto (prompt/completion/label rows).",
                     choices=METHODS)
    dataset: str = _f(BUILTIN_DATASET, "Training data: a .json/.jsonl/.csv/.parquet file, a hub id, "
                      f"or {BUILTIN_DATASET} (self-cognition Q&A built from bot_name and bot_author), "
                      f"or {BUILTIN_CONCISE} (preference pairs from the base model's own answers, the "
                      "concise one preferred: for a preference method).")
    dataset_format: str = _f("auto", "Row format: auto-detect, alpaca (instruction/input/output), "
                             "sharegpt (conversations from/value), messages (role/content) or text.",
                             choices=DATASET_FORMATS)
    bot_name: str = _f("Fusetune", "The name the identity dataset teaches the model to call itself.")
    bot_author: str = _f("Fusetune Studio", "Who the identity dataset says built the model.")
    output_dir: str = _f("", "Folder the job writes its log, events, checkpoints and adapter to. "
                         "The studio fills it in; empty means ./outputs/<model>-<time>.")
    lora_r: int = _f(16, "LoRA rank: the size of the trainable low-rank update.", min=1, max=1024)
    lora_alpha: int = _f(32, "LoRA alpha: the update is scaled by alpha / r.", min=1, max=4096)
    lora_dropout: float = _f(0.0, "Dropout on the LoRA input (0 keeps the fused kernels usable).",
                             min=0.0, max=0.9)
    target_modules: Any = _f("all-linear", "Modules that get LoRA: 'all-linear' or a list of names "
                             "such as [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj].")
    load_in_4bit: bool = _f(False, "QLoRA: store the frozen base weights in 4-bit NF4 (bitsandbytes); a fraction of the memory, "
                         "fast on a CUDA GPU, slow on CPU.")
    fused_kernels: bool = _f(False, "Use Fusetune's Triton engine; parts it cannot run fall back to "
                             "PyTorch and the log says why.")
    gradient_checkpointing: str = _f("auto", "Recompute activations in backward to save memory: auto, "
                                     "on, off, or offload (layer inputs kept in CPU memory).",
                                     choices=CHECKPOINTING)
    base_precision: str = _f("bf16", "Precision of the frozen base weights: bf16, or fp8 (float8 e4m3 with "
                             "per-channel scales: half the base memory, faster matrix products; Hopper GPUs "
                             "and newer).", choices=BASE_PRECISIONS)
    dtype: str = _f("auto", "Training precision: auto (bf16 on a GPU that supports it, fp32 on CPU), "
                    "bf16, fp16 or fp32.", choices=DTYPES)
    max_seq_length: int = _f(256, "Longest tokenized example; longer ones are truncated.", min=8, max=1048576)
    packing: str = _f("auto", "Pack several examples into each row of max_seq_length (attention never crosses "
                      "an example): auto (on a GPU when rows are shorter than max_seq_length), on or off.",
                      choices=PACKING)
    batch_size: int = _f(4, "Examples per micro-batch.", min=1, max=4096)
    gradient_accumulation_steps: int = _f(1, "Micro-batches per optimizer step.", min=1, max=4096)
    learning_rate: float = _f(2e-4, "Peak learning rate of the cosine schedule.", min=1e-8, max=1.0)
    warmup_steps: int = _f(5, "Steps of linear warm-up before the cosine decay.", min=0, max=1_000_000)
    weight_decay: float = _f(0.0, "AdamW weight decay on the LoRA weights.", min=0.0, max=1.0)
    max_grad_norm: float = _f(1.0, "Clip the gradient norm to this (0 turns clipping off).", min=0.0, max=1e6)
    max_steps: int = _f(60, "Optimizer steps to run; 0 means run num_epochs over the data.", min=0, max=10_000_000)
    num_epochs: float = _f(1.0, "Passes over the data when max_steps is 0.", min=0.0, max=1000.0)
    save_steps: int = _f(20, "Write a resumable checkpoint every this many steps (0: only at the end).",
                         min=0, max=10_000_000)
    eval_fraction: float = _f(0.0, "Share of the dataset held out for evaluation (seeded); 0: none.",
                              min=0.0, max=0.5)
    eval_dataset: str = _f("", "A separate evaluation file (.json/.jsonl/.csv/.parquet); empty: use "
                           "eval_fraction.")
    eval_steps: int = _f(0, "Evaluate every this many steps (0: only at the end) when there is eval data.",
                         min=0, max=10_000_000)
    keep_best: bool = _f(False, "Keep the adapter with the lowest eval loss instead of the last one.")
    gpus: str = _f("auto", "GPUs the job may use: auto (the first free one), all, or a list such as 0,1.")
    processes: int = _f(0, "Data-parallel processes: 0 means one per chosen GPU (1 on CPU); on CPU, "
                        "several processes use gloo (for tests).", min=0, max=1024)
    seed: int = _f(42, "Random seed for LoRA init, shuffling and dropout.", min=0, max=2**32 - 1)
    resume_from: str = _f("", "A checkpoints/step-N folder to resume from (empty: start fresh).")
    # preference tuning (method dpo/orpo/simpo/kto); defaults are TRL's (DPOConfig, ORPOConfig, CPOConfig, KTOConfig)
    beta: float = _f(0.1, "Preference methods: the temperature of the implicit reward (DPO, SimPO, KTO; "
                     "TRL's beta): higher keeps the tuned model closer to the reference.", min=0.0, max=100.0)
    simpo_gamma: float = _f(0.5, "SimPO: the target reward margin gamma between chosen and rejected "
                            "(TRL's simpo_gamma).", min=0.0, max=100.0)
    orpo_lambda: float = _f(0.1, "ORPO: the weight of the odds-ratio term beside the NLL on chosen answers "
                            "(the paper's lambda; TRL's ORPOConfig calls it beta).", min=0.0, max=100.0)
    kto_desirable_weight: float = _f(1.0, "KTO: the loss weight of desirable (label true) answers.",
                                     min=0.0, max=100.0)
    kto_undesirable_weight: float = _f(1.0, "KTO: the loss weight of undesirable (label false) answers.",
                                       min=0.0, max=100.0)
    precompute_reference: bool = _f(False, "DPO/KTO: compute the reference model's log-probs once over the "
                                    "dataset before training (the base model with the adapter off) instead "
                                    "of at every step.")

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobSpec":
        """Build and validate a spec; unknown keys are refused by name."""
        if not isinstance(data, dict):
            raise SpecError(None, "the config must be one flat mapping of key: value pairs")
        known = set(cls.field_names())
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise SpecError(unknown[0], f"unknown key (known keys: {', '.join(sorted(known))})")
        spec = cls(**{k: _coerce(k, v) for k, v in data.items()})
        spec.validate()
        return spec

    @classmethod
    def from_yaml(cls, path: str | Path) -> "JobSpec":
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(None, f"{path} is not valid YAML: {exc}") from exc
        return cls.from_dict(data or {})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=10_000)

    def write_yaml(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(), encoding="utf-8")
        return path

    # ---- validation ---------------------------------------------------------------------
    def validate(self) -> None:
        """Raise SpecError naming the first bad field. Checks only what needs no model load."""
        for f in dataclasses.fields(self):
            _check_bounds(f, getattr(self, f.name))
        if not self.model.strip():
            raise SpecError("model", "is empty: pick the built-in model, a hub id, a folder or a .gguf file")
        if not self.dataset.strip():
            raise SpecError("dataset", "is empty: pick builtin:identity or upload a data file")
        _check_dataset_path(self.dataset)
        _check_model_path(self.model)
        self.target_modules = _normalise_targets(self.target_modules)
        if self.max_steps == 0 and self.num_epochs <= 0:
            raise SpecError("num_epochs", "must be > 0 when max_steps is 0 (or set max_steps)")
        if self.dataset == BUILTIN_DATASET and not self.bot_name.strip():
            raise SpecError("bot_name", "is empty: the identity dataset needs a name to teach")
        _check_builtin_method(self)
        if self.resume_from and not Path(self.resume_from).is_dir():
            raise SpecError("resume_from", f"{self.resume_from} is not a checkpoint folder")
        if self.eval_dataset:
            _check_dataset_path(self.eval_dataset, key="eval_dataset")
            if self.eval_dataset.startswith("builtin:"):
                raise SpecError("eval_dataset", "must be a data file; leave it empty to hold out eval_fraction")
            if self.eval_fraction > 0:
                raise SpecError("eval_fraction", "set either eval_fraction or eval_dataset, not both")
        _check_base_precision(self)
        _check_preference(self)
        if self.keep_best and not (self.eval_fraction > 0 or self.eval_dataset):
            raise SpecError("keep_best", "needs eval data: set eval_fraction or eval_dataset")
        self.gpus = _normalise_gpus(self.gpus)
        gpu_list = self.gpu_indices()
        if self.processes and gpu_list is not None and self.processes != len(gpu_list):
            raise SpecError("processes", f"is {self.processes} but gpus lists {len(gpu_list)} GPU(s); "
                            "use one process per GPU (or 0 for automatic)")

    def gpu_indices(self) -> list[int] | None:
        """The explicit GPU list (gpus: "0,1" -> [0, 1]); None for auto/all."""
        if self.gpus in ("auto", "all"):
            return None
        return [int(part) for part in self.gpus.split(",")]


def _coerce(key: str, value: Any) -> Any:
    """Turn YAML / form / CLI values into the field's type, refusing what does not fit."""
    kind = JobSpec.__dataclass_fields__[key].type
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
                return value.lower() in ("true", "yes", "1", "on")
            raise ValueError
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError
            as_float = float(value)
            if not as_float.is_integer():
                raise ValueError
            return int(as_float)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            return number
        if kind == "str":
            if value is None:
                return ""
            if key == "gpus" and isinstance(value, (list, tuple)):
                return ",".join(str(v) for v in value)  # gpus: [0, 1] in YAML
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        raise SpecError(key, f"{value!r} is not a valid {kind}") from None
    return value


def _check_builtin_method(spec: "JobSpec") -> None:
    """The built-in sets are of one kind each: identity is SFT rows, concise is preference pairs."""
    if spec.dataset == BUILTIN_CONCISE and spec.method == "sft":
        preference = ", ".join(PREFERENCE_METHODS)
        raise SpecError("method", f"sft cannot train on {BUILTIN_CONCISE}: it is a set of preference pairs; "
                        f"pick {preference}, or the dataset {BUILTIN_DATASET} for sft")
    if spec.dataset == BUILTIN_DATASET and spec.method in PREFERENCE_METHODS:
        raise SpecError("method", f"{spec.method} trains on preference pairs, and {BUILTIN_DATASET} has "
                        f"answers, not pairs: pick the dataset {BUILTIN_CONCISE} or a preference file, "
                        "or method sft")


def _check_base_precision(spec: "JobSpec") -> None:
    if spec.base_precision != "fp8":
        return
    if spec.load_in_4bit:
        raise SpecError("base_precision", "fp8 cannot be combined with load_in_4bit: QLoRA keeps its base "
                        "weights in 4-bit NF4; set base_precision: bf16 for QLoRA, or load_in_4bit: false for FP8")
    if not spec.fused_kernels:
        raise SpecError("base_precision", "fp8 runs on the fused engine: set fused_kernels: true "
                        "(or base_precision: bf16)")


def _check_preference(spec: "JobSpec") -> None:
    """The preference keys: beta must be positive; weights not both zero; a reference only where used."""
    if spec.method not in PREFERENCE_METHODS:
        return
    if spec.method != "orpo" and spec.beta <= 0:
        raise SpecError("beta", f"must be > 0 for {spec.method} (TRL's default is 0.1)")
    if spec.method == "orpo" and spec.orpo_lambda <= 0:
        raise SpecError("orpo_lambda", "must be > 0 (TRL's default is 0.1)")
    if spec.method == "kto" and spec.kto_desirable_weight == 0 and spec.kto_undesirable_weight == 0:
        raise SpecError("kto_desirable_weight", "and kto_undesirable_weight are both 0: nothing would train")
    if spec.precompute_reference and spec.method in REFERENCE_FREE_METHODS:
        raise SpecError("precompute_reference", f"{spec.method} uses no reference model; set it to false")


def _check_bounds(f: dataclasses.Field, value: Any) -> None:
    meta = f.metadata
    if "choices" in meta and value not in meta["choices"]:
        raise SpecError(f.name, f"{value!r} is not one of {', '.join(meta['choices'])}")
    if "min" in meta and value < meta["min"]:
        raise SpecError(f.name, f"{value} is below the minimum {meta['min']}")
    if "max" in meta and value > meta["max"]:
        raise SpecError(f.name, f"{value} is above the maximum {meta['max']}")


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or Path(value).suffix != ""


def _check_dataset_path(dataset: str, key: str = "dataset") -> None:
    if dataset.startswith("builtin:"):
        if dataset not in BUILTIN_DATASETS:
            raise SpecError(key, f"unknown built-in dataset {dataset!r}; the built-in ones are "
                            f"{', '.join(BUILTIN_DATASETS)}")
        return
    if not _looks_like_path(dataset):
        return  # a hub id; checked when it loads
    path = Path(dataset).expanduser()
    if path.suffix.lower() not in DATASET_SUFFIXES:
        raise SpecError(key, f"{path.name} has an unsupported type; use one of {', '.join(DATASET_SUFFIXES)}")
    if not path.is_file():
        raise SpecError(key, f"file {path} does not exist")


def _check_model_path(model: str) -> None:
    if model.startswith("builtin:"):
        if model != BUILTIN_MODEL:
            raise SpecError("model", f"unknown built-in model {model!r}; the built-in one is {BUILTIN_MODEL}")
        return
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        if not path.is_file():
            raise SpecError("model", f"GGUF file {path} does not exist")
    elif model.startswith(("/", "./", "../", "~")):
        if not (path / "config.json").is_file():
            raise SpecError("model", f"{path} is not a Hugging Face model folder (no config.json)")


def _normalise_targets(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text in ("all-linear", ""):
            return "all-linear"
        text = text.removeprefix("[").removesuffix("]")  # "[q_proj, v_proj]" from a form or the CLI
        value = [part.strip().strip("'\"") for part in text.replace("\n", ",").split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError("target_modules", "must be 'all-linear' or a non-empty list of module names")
    names = [str(v).strip() for v in value]
    for name in names:
        if not name or set(name) - MODULE_NAME_CHARS:
            raise SpecError("target_modules", f"{name!r} is not a module name (letters, digits, _ and .)")
    return names


def _normalise_gpus(value: Any) -> str:
    """"auto", "all" or a comma list of distinct GPU indices ("0,1"); [0, 1] from YAML is accepted."""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = str(value).strip().lower().replace(" ", "").removeprefix("[").removesuffix("]")
    if text in ("", "auto"):
        return "auto"
    if text == "all":
        return "all"
    parts = text.split(",")
    if not all(part.isdigit() for part in parts):
        raise SpecError("gpus", f"{value!r} is not auto, all or a list of GPU numbers such as 0,1")
    if len(set(parts)) != len(parts):
        raise SpecError("gpus", f"{value!r} names a GPU twice")
    return ",".join(str(int(part)) for part in parts)
