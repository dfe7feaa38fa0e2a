"""JobSpec: the one typed description of a training job.

The same dataclass feeds the studio's Train form, the YAML file a job runs from and the
``python -m jobs.train`` command line (the idea of one args dataclass for all three comes from
litgpt's ``args.py``). Each field carries its help text in ``metadata["help"]``; validation names
the offending key and says how to fix it, and runs before anything is loaded.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jobs.messages import say
from jobs.errors import SpecError  # noqa: F401  (the spec's error; importers take it from here)
from jobs.spec_values import BUILTIN_SHAPES  # noqa: F401  (re-exported: image-text data, jobs/data/builtin/shapes.py)
from jobs.spec_values import (  # noqa: F401  (re-exported: importers name jobs.spec)
    BASE_PRECISIONS, BUILTIN_CONCISE, BUILTIN_DATASET, BUILTIN_DATASETS, BUILTIN_MODEL, BUILTIN_PROMPT_DATASETS, BUILTIN_REWARDS, CHECKPOINTING,
    DATASET_FORMATS, DATASET_SUFFIXES, DTYPES, GRPO_LOSS_TYPES, HUB_ID, METHODS, MODULE_NAME_CHARS, PACKING,
    PREFERENCE_METHODS, REFERENCE_FREE_METHODS, REPORT_TO, SHARDINGS, _PART, _check_base_precision, _check_builtin_method, _check_cluster, _check_dataset_path, _check_nodes,
    _check_grpo, _check_model_path, _check_preference, _check_run_inputs, _check_sharding, _looks_like_path, _normalise_gpus,
    _normalise_report_to, _normalise_targets, _parse_rewards, hub_id_problem, is_local_reference,
    reward_entries, short_name, trackers)
from jobs.spec_values import MAX_NAME_CHARS, text_problem  # noqa: F401  (shown names: jobs/spec_values.py)
from jobs.yaml_bounded import load_config_yaml


# Keys whose default depends on the method, filled by `from_dict` when the config does not set them.
# grpo's beta is 0.0, TRL's GRPOConfig default (following DAPO and Dr. GRPO, which train with
# verifiable rewards without the KL term): no reference forward per micro-batch (a quarter or more of
# the policy step), and the step bench/bench_grpo.py compares against TRL's is the same step.
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {"grpo": {"beta": 0.0}}
# Keys whose default depends on the dataset, likewise (the form shows them for its default dataset and
# follows a change of dataset: studio/method_fields.py). builtin:identity trains at 4e-4: in the default
# 60 steps, 2e-4 put the name in the chat template's default line only; served with the base model's
# own template (vLLM, a PEFT script) the adapter invented names (issue 42, measured in README's identity
# section); the recipe's replayed general answers keep most of the base's other answers at this rate.
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {BUILTIN_DATASET: {"learning_rate": 4e-4}}


def _f(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its help text (and optional choices / bounds) in metadata."""
    meta = {"help": help, **extra}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class JobSpec:
    """Everything a training job needs. Defaults are the built-in CPU quick start."""

    name: str = _f("", "The job's display name (empty: model · dataset, plus the bot name for identity jobs).",
                   max_chars=MAX_NAME_CHARS)
    model: str = _f(BUILTIN_MODEL, "Base model: a hub id, a local Hugging Face folder, a .gguf file, "
                    f"or {BUILTIN_MODEL} (ships with Fusetune, runs offline).")
    method: str = _f("sft", "Training method: sft (supervised fine-tuning on answers); preference tuning on "
                     "chosen/rejected pairs: dpo, orpo, simpo, or kto (prompt/completion/label rows); or grpo "
                     "(reinforcement learning with verifiable rewards: sampled completions scored by `rewards`).",
                     choices=METHODS)
    dataset: str = _f(BUILTIN_DATASET, "Training data: a .json/.jsonl/.csv/.parquet file, a hub id, "
                      f"{BUILTIN_DATASET} (self-cognition Q&A built from bot_name and bot_author), "
                      f"{BUILTIN_CONCISE} (preference pairs from the base model's own answers, the "
                      "concise one preferred: for a preference method), or builtin:arithmetic (word problems "
                      "with numeric answers: for grpo), or builtin:shapes (images of coloured shapes to count: for a "
                      "vision-language model).")
    dataset_format: str = _f("auto", "Row format: auto-detect, alpaca (instruction/input/output), "
                             "sharegpt (conversations from/value), messages (role/content) or text.",
                             choices=DATASET_FORMATS)
    bot_name: str = _f("Fusetune", "The name the identity dataset teaches the model to call itself.",
                       max_chars=MAX_NAME_CHARS, allow_chars="\n\t")
    bot_author: str = _f("Fusetune Studio", "Who the identity dataset says built the model.",
                         max_chars=MAX_NAME_CHARS, allow_chars="\n\t")
    output_dir: str = _f("", "Folder the job writes its log, events, checkpoints and adapter to. "
                         "The studio fills it in; empty means ./outputs/<model>-<time>.")
    lora_r: int = _f(16, "LoRA rank: the size of the trainable low-rank update.", min=1, max=1024)
    lora_alpha: int = _f(32, "LoRA alpha: the update is scaled by alpha / r.", min=1, max=4096)
    lora_dropout: float = _f(0.0, "Dropout on the LoRA input (0 keeps the fused kernels usable).",
                             min=0.0, max=0.9)
    target_modules: Any = _f("all-linear", "Modules that get LoRA: 'all-linear' or a list of names "
                             "such as [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj].")
    vision_lora: bool = _f(False, "Vision-language models: also give LoRA to the vision tower and the projector "
                           "(by default all-linear covers the language model only and they stay frozen).")
    load_in_4bit: bool = _f(False, "QLoRA: store the frozen base weights in 4-bit NF4 (bitsandbytes); a fraction of the memory, "
                         "fast on a CUDA GPU, slow on CPU.")
    fused_kernels: bool = _f(False, "Use Fusetune's Triton engine; parts it cannot run fall back to "
                             "PyTorch and the log says why.")
    gradient_checkpointing: str = _f("auto", "Recompute activations in backward to save memory: auto, "
                                     "on, off, or offload (layer inputs kept in CPU memory).",
                                     choices=CHECKPOINTING)
    max_gpu_memory_gb: float = _f(0.0, "GPU memory the job may allocate, in GiB (0: no budget): the peak of torch's allocated memory, as the bench rows and peers are measured; the CUDA context (~0.75 GiB) comes on top. With gradient_checkpointing auto the fused engine picks the fastest plan that fits it (which layers keep their activations, which are recomputed or offloaded; a preference or text SFT job may train each micro-batch in passes of fewer rows), a budget no plan can meet is refused before the job starts, and the queue waits for the predicted peak. For GPUs only.", min=0.0, max=100_000.0)
    base_precision: str = _f("bf16", "Precision of the frozen base weights: bf16, or fp8 (float8 e4m3 with "
                             "per-channel scales: half the base memory, faster matrix products; Hopper GPUs "
                             "and newer).", choices=BASE_PRECISIONS)
    dtype: str = _f("auto", "Training precision: auto (bf16 on a GPU that supports it, fp32 on CPU), "
                    "bf16, fp16 or fp32.", choices=DTYPES)
    max_seq_length: int = _f(256, "Longest tokenized example; longer ones are truncated.", min=8, max=1048576)
    packing: str = _f("auto", "Pack several examples into each row of max_seq_length (attention never crosses "
                      "an example): auto (on a GPU when rows are shorter than max_seq_length), on or off. grpo: "
                      "each micro-batch's prompt + completion sequences in one row (auto: on a GPU).",
                      choices=PACKING)
    batch_size: int = _f(4, "Examples per micro-batch.", min=1, max=4096)
    gradient_accumulation_steps: int = _f(1, "Micro-batches per optimizer step.", min=1, max=4096)
    learning_rate: float = _f(2e-4, "Peak learning rate of the cosine schedule (builtin:identity: 0.0004 unless set, "
                              "so that its few steps put the name in the weights).", min=1e-8, max=1.0)
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
    sharding: str = _f("none", "Sharded training over the job's processes: none (each holds the whole model, data "
                       "parallel), fsdp (PyTorch FSDP2: each decoder layer's base weights and LoRA split across the "
                       "processes, so a model too big for one GPU trains on several), or auto (fsdp when the fit check "
                       "says one GPU cannot hold the job and several are chosen). Every method, vision-language models "
                       "and load_in_4bit too; not yet fp8.", choices=SHARDINGS)
    cluster: str = _f("", "Where the job trains: empty for this machine, or a Ray cluster's dashboard address "
                      "such as http://head-node:8265 (what `ray job submit` takes). The job folder and the data "
                      "dir must be at the same path on every node (shared storage).")
    workers: int = _f(1, "Ray cluster: training processes (Ray Train workers, data parallel between them); "
                      "batch_size stays per worker.", min=1, max=1024)
    gpus_per_worker: int = _f(1, "Ray cluster: GPUs each worker trains on: 1 (NCCL between workers) or 0 to "
                              "train on CPUs (gloo).", min=0, max=1)
    nodes: int = _f(1, "Machines the job trains on without Ray (torchrun's rendezvous): 1 for this one; with more, "
                    "start the same job on every machine (its studio or python -m jobs.train), each with its "
                    "node_rank and all with the same rdzv_endpoint; each runs its processes as on one machine "
                    "(the same number on every node).", min=1, max=1024)
    node_rank: int = _f(0, "Several machines: this machine's number, 0 to nodes - 1; node 0 is at rdzv_endpoint and "
                        "writes the job's events, checkpoints and adapter.", min=0, max=1023)
    rdzv_endpoint: str = _f("", "Several machines: node 0's host:port where every node's torchrun meets, "
                            "e.g. 10.0.0.1:29500 (a free port on node 0).")
    seed: int = _f(42, "Random seed for LoRA init, shuffling and dropout.", min=0, max=2**32 - 1)
    resume_from: str = _f("", "A checkpoints/step-N folder to resume from (empty: start fresh).")
    report_to: Any = _f("none", "Experiment tracking, written into the job folder: none, or one or more of "
                        "tensorboard (event files in tensorboard/), mlflow (a local store in mlruns/), wandb "
                        "(an offline run in wandb/), e.g. tensorboard, mlflow.")
    # preference tuning (method dpo/orpo/simpo/kto); defaults are TRL's (DPOConfig, ORPOConfig, CPOConfig, KTOConfig)
    beta: float = _f(0.1, "Preference methods: the temperature of the implicit reward (DPO, SimPO, KTO; "
                     "TRL's beta): higher keeps the tuned model closer to the reference. grpo: the weight of the "
                     "KL penalty to the base model (adapter off); 0 skips the reference pass. Default 0.1; for "
                     "grpo 0.0 when beta is not given (TRL's GRPOConfig default).",
                     min=0.0, max=100.0)
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
    # ---- grpo (method: grpo; batch_size counts prompts) ------------------------------------
    num_generations: int = _f(4, "grpo: completions sampled per prompt (the group compared).", min=2, max=256)
    max_completion_length: int = _f(64, "grpo: most tokens per completion (it stops at EOS).", min=1, max=131072)
    temperature: float = _f(1.0, "grpo: sampling temperature (also of the log-probs).", min=0.01, max=10.0)
    top_p: float = _f(1.0, "grpo: nucleus sampling: the smallest token set with probability top_p.", min=0.01, max=1.0)
    epsilon: float = _f(0.2, "grpo: clip range of the probability ratio below 1 (PPO's epsilon).", min=0.0, max=10.0)
    epsilon_high: float = _f(0.0, "grpo: clip range above 1 (DAPO's clip-higher); 0: epsilon.", min=0.0, max=10.0)
    loss_type: str = _f("dapo", "grpo: loss normalisation: grpo (mean per completion, then over completions), dapo "
                        "(mean over all completion tokens of the step) or dr_grpo (sum / max_completion_length).",
                        choices=GRPO_LOSS_TYPES)
    rewards: str = _f("", "grpo: rewards, a list of name or name:weight (answer, format, think_format, length, "
                      "json, or a function of reward_file); empty: the dataset's preset (answer, format).")
    reward_file: str = _f("", "grpo: a Python file whose top-level functions not starting with _ are rewards "
                          "(prompts, completions, **columns) -> list[float]; the studio runs it only from "
                          "<data dir>/rewards/, an --allow-dir folder outside the data dir, or as an upload "
                          "with --allow-reward-code (docs/SECURITY.md).")

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, to_run: bool = True) -> "JobSpec":
        """Build and validate a spec; unknown keys are refused by name. `to_run=False`: the config of a
        job that has run, read back to export it (see `validate`)."""
        if not isinstance(data, dict):
            raise SpecError(None, say("config_not_flat"))
        known = set(cls.field_names())
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise SpecError(unknown[0], say("config_unknown_key", known=", ".join(sorted(known))))
        given = {k: _coerce(k, v) for k, v in data.items()}
        dataset = str(given.get("dataset", cls.__dataclass_fields__["dataset"].default)).strip()
        spec = cls(**{**METHOD_DEFAULTS.get(str(given.get("method", "")).strip(), {}),
                      **DATASET_DEFAULTS.get(dataset, {}), **given})
        spec.validate(to_run=to_run)
        return spec

    @classmethod
    def from_yaml(cls, path: str | Path, *, to_run: bool = True) -> "JobSpec":
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = load_config_yaml(text, str(path))
        except yaml.YAMLError as exc:
            raise SpecError(None, say("config_not_yaml", path=path, detail=exc)) from exc
        return cls.from_dict(data or {}, to_run=to_run)

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
    def validate(self, to_run: bool = True) -> None:
        """Raise SpecError naming the first bad field. Checks only what needs no model load.

        Every value is checked either way; `to_run=False` leaves out only whether the files a start
        reads are still there (data, reward file, resume checkpoint: _check_run_inputs), since a job
        that has run is exported from its model, adapter and tokenizer alone."""
        for f in dataclasses.fields(self):
            _check_bounds(f, getattr(self, f.name))
        if not self.model.strip():
            raise SpecError("model", say("model_empty"))
        if not self.dataset.strip():
            raise SpecError("dataset", say("dataset_empty"))
        _check_dataset_path(self.dataset)
        _check_model_path(self.model)
        self.target_modules = _normalise_targets(self.target_modules)
        self.report_to = _normalise_report_to(self.report_to)
        if self.max_steps == 0 and self.num_epochs <= 0:
            raise SpecError("num_epochs", say("epochs_needed"))
        if self.dataset == BUILTIN_DATASET and not self.bot_name.strip():
            raise SpecError("bot_name", say("bot_name_empty"))
        if self.eval_dataset:
            _check_dataset_path(self.eval_dataset, key="eval_dataset")
            if self.eval_dataset.startswith("builtin:"):
                raise SpecError("eval_dataset", say("eval_dataset_builtin"))
            if self.eval_fraction > 0:
                raise SpecError("eval_fraction", say("eval_both"))
        _check_base_precision(self)
        _check_sharding(self)
        _check_preference(self)
        _check_grpo(self)
        _check_builtin_method(self)   # after the method's own keys: a bad key is named before the dataset kind
        if self.keep_best and not (self.eval_fraction > 0 or self.eval_dataset):
            raise SpecError("keep_best", say("keep_best_needs_eval"))
        self.gpus = _normalise_gpus(self.gpus)
        gpu_list = self.gpu_indices()
        if self.processes and gpu_list is not None and self.processes != len(gpu_list):
            raise SpecError("processes", say("processes_gpus", processes=self.processes, count=len(gpu_list)))
        _check_cluster(self)
        _check_nodes(self)
        if to_run:
            _check_run_inputs(self)

    def optimizer_steps(self, per_epoch: int) -> int:
        """The optimizer steps a run of this spec takes over a plan of `per_epoch` micro-batches an epoch:
        max_steps when set, else num_epochs of them (at least one)."""
        if self.max_steps > 0:
            return self.max_steps
        return max(1, math.ceil(math.ceil(per_epoch / self.gradient_accumulation_steps) * self.num_epochs))

    def batch_tokens(self) -> int:
        """Tokens one micro-batch of this method holds at most, what memory is sized by (the fit check and
        the checkpointing policy): sft batch_size rows of max_seq_length; a preference method batch_size
        pairs, each a row of up to 2 x max_seq_length (the prompt with its chosen and its rejected answer,
        or KTO's example and its mismatched one); grpo batch_size prompts x num_generations completions,
        each a prompt of up to max_seq_length plus max_completion_length."""
        if self.method in PREFERENCE_METHODS:
            return self.batch_size * 2 * self.max_seq_length
        if self.method == "grpo":
            return self.batch_size * self.num_generations * (self.max_seq_length + self.max_completion_length)
        return self.batch_size * self.max_seq_length

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
            if key in ("gpus", "rewards") and isinstance(value, (list, tuple)):
                return ",".join(str(v) for v in value)  # gpus: [0, 1] or rewards: [answer, format] in YAML
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        raise SpecError(key, say("value_invalid", value=value, kind=kind)) from None
    return value


def _check_bounds(f: dataclasses.Field, value: Any) -> None:
    meta = f.metadata
    if "choices" in meta and value not in meta["choices"]:
        raise SpecError(f.name, say("value_not_choice", value=value, choices=", ".join(meta["choices"])))
    if "min" in meta and value < meta["min"]:
        raise SpecError(f.name, say("value_below_min", value=value, min=meta["min"]))
    if "max" in meta and value > meta["max"]:
        raise SpecError(f.name, say("value_above_max", value=value, max=meta["max"]))
    if "max_chars" in meta:   # a shown name: bounded, and no control character that hides or reorders text
        problem = text_problem(value, meta["max_chars"], meta.get("allow_chars", ""))
        if problem:
            raise SpecError(f.name, problem)
