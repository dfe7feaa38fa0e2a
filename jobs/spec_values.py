"""The values JobSpec's keys may take and the rules that check them (jobs/spec.py holds the fields).

Kept below the spec so the dataclass file stays one readable list of keys; everything here is re-exported
by jobs/spec.py, the name importers use."""
from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.messages import say
from jobs.errors import SpecError

if TYPE_CHECKING:
    from jobs.spec import JobSpec

BUILTIN_MODEL = "builtin:smollm2-135m-instruct"
BUILTIN_DATASET = "builtin:identity"
# the built-in preference set (jobs/data/builtin/concise.py): the base model's answers, short one preferred
BUILTIN_CONCISE = "builtin:concise"
DATASET_FORMATS = ("auto", "alpaca", "sharegpt", "messages", "text")
DTYPES = ("auto", "bf16", "fp16", "fp32")
CHECKPOINTING = ("auto", "on", "off", "offload")
PACKING = ("auto", "on", "off")
BASE_PRECISIONS = ("bf16", "fp8")
SHARDINGS = ("none", "fsdp", "auto")   # jobs/train/sharding.py
REPORT_TO = ("none", "tensorboard", "mlflow", "wandb")
DATASET_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")
# training methods (jobs/train/methods/): each new one adds its name here and its class there
METHODS = ("sft", "dpo", "orpo", "simpo", "kto", "grpo")
PREFERENCE_METHODS = ("dpo", "orpo", "simpo", "kto")
REFERENCE_FREE_METHODS = ("orpo", "simpo")
BUILTIN_PROMPT_DATASETS = ("builtin:arithmetic",)   # prompt data for grpo (jobs/data/builtin/arithmetic.py)
BUILTIN_SHAPES = "builtin:shapes"   # image-text rows drawn with PIL, for vision-language models (jobs/data/builtin/shapes.py)
BUILTIN_DATASETS = (BUILTIN_DATASET, BUILTIN_CONCISE, *BUILTIN_PROMPT_DATASETS, BUILTIN_SHAPES)
GRPO_LOSS_TYPES = ("grpo", "dapo", "dr_grpo")
BUILTIN_REWARDS = ("answer", "format", "think_format", "length", "json")   # jobs/train/rewards/builtin.py
MODULE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")
# Names shown on the page and in labels (name, bot_name, bot_author): a length limit, checked before
# anything reads the text, and no character that makes the shown text lie: C0/C1 controls, and the
# bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069; "Trojan Source",
# CVE-2021-42574), which reorder the text around them, e.g. the job dropdown's labels. Marks
# (U+200E/U+200F) only set the direction of neutral characters and stay allowed.
MAX_NAME_CHARS = 200
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


# owner/name as the Hub spells it: letters, digits, '-', '_' and '.', not starting or ending with
# '-' or '.', at most 96 characters each; '..' anywhere is refused by hub_id_problem.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HUB_ID = re.compile(rf"{_PART}/{_PART}")


def text_problem(value: str, limit: int, allowed: str = "") -> str | None:
    """Why `value` cannot be a shown name (None when it can): over `limit` characters, or holding a
    control or bidi-override character that is not in `allowed` (named by its code point and place)."""
    if len(value) > limit:   # first: a 50 MB name is refused by its length, never scanned
        return say("text_too_long", length=len(value), limit=limit)
    for index, char in enumerate(value, 1):
        if (char in BIDI_CONTROLS or unicodedata.category(char) == "Cc") and char not in allowed:
            return say("text_control_char", char=f"U+{ord(char):04X}", index=index)
    return None


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


def _check_grpo(spec: "JobSpec") -> None:
    """The grpo keys; the reward names are checked against the reward file at preflight."""
    spec.rewards = _parse_rewards(spec.rewards)
    if spec.method != "grpo" and spec.dataset in BUILTIN_PROMPT_DATASETS:
        raise SpecError("dataset", say("prompt_data_needs_grpo", dataset=spec.dataset))
    path = Path(spec.reward_file).expanduser()
    if spec.method == "grpo" and spec.reward_file and path.suffix != ".py":
        raise SpecError("reward_file", say("reward_file_missing", path=path))
    if spec.method == "grpo" and (spec.eval_fraction or spec.eval_dataset or spec.keep_best):
        raise SpecError("eval_fraction", say("grpo_no_eval"))


def reward_entries(value: str) -> list[str]:
    """JobSpec.rewards ("answer:1, format:0.5" once validated) as ["answer:1", "format:0.5"]."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _parse_rewards(value: str) -> str:
    """rewards in the canonical "name:weight, ..." form (weight 1 when left out)."""
    parts = value.replace("\n", ",").removeprefix("[").removesuffix("]").split(",")
    out = []
    for part in (str(p).strip().strip("'\"") for p in parts):
        name, _, weight = part.partition(":")
        if not part:
            continue
        if not name.strip().isidentifier():
            raise SpecError("rewards", say("reward_name_invalid", name=name))
        try:
            number = float(weight) if weight.strip() else 1.0
        except ValueError:
            raise SpecError("rewards", say("reward_weight_invalid", part=part)) from None
        out.append(f"{name.strip()}:{number:g}")
    return ", ".join(out)


def _check_builtin_method(spec: "JobSpec") -> None:
    """The built-in sets are of one kind each: identity is SFT rows, concise is preference pairs."""
    if spec.dataset == BUILTIN_CONCISE and spec.method == "sft":
        preference = ", ".join(PREFERENCE_METHODS)
        raise SpecError("method", say("sft_on_pairs", dataset=BUILTIN_CONCISE, methods=preference,
                                      identity=BUILTIN_DATASET))
    if spec.dataset == BUILTIN_DATASET and spec.method in PREFERENCE_METHODS:
        raise SpecError("method", say("pairs_method_on_answers", method=spec.method, identity=BUILTIN_DATASET,
                                      concise=BUILTIN_CONCISE))


def _check_base_precision(spec: "JobSpec") -> None:
    if spec.base_precision != "fp8":
        return
    if spec.load_in_4bit:
        raise SpecError("base_precision", say("fp8_with_4bit"))
    if not spec.fused_kernels:
        raise SpecError("base_precision", say("fp8_needs_fused_kernels"))


# A Ray dashboard (Jobs API) address, as `ray job submit --address` takes it: http(s)://host[:port]
CLUSTER_ADDRESS = re.compile(r"^https?://[A-Za-z0-9.\-]+(:\d{1,5})?/?$|^https?://\[[0-9A-Fa-f:.]+\](:\d{1,5})?/?$")


def _check_cluster(spec: "JobSpec") -> None:
    """cluster, workers, gpus_per_worker: a dashboard address; on a cluster Ray places the job, so
    this machine's gpus/processes keep their defaults; workers only with a cluster."""
    spec.cluster = spec.cluster.strip()
    if not spec.cluster:
        if spec.workers > 1:
            raise SpecError("workers", say("workers_need_cluster", workers=spec.workers))
        return
    if not CLUSTER_ADDRESS.match(spec.cluster):
        raise SpecError("cluster", say("cluster_address_invalid", value=spec.cluster))
    if spec.processes > 1:
        raise SpecError("processes", say("cluster_places_job", default=0))
    if spec.gpus != "auto":
        raise SpecError("gpus", say("cluster_places_job", default="auto"))


ENDPOINT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+):(\d{1,5})$")


def _check_nodes(spec: "JobSpec") -> None:
    """nodes, node_rank, rdzv_endpoint: several machines meet at node 0's host:port (torchrun's static
    rendezvous, jobs/launch.py); one machine needs neither; a Ray cluster places its own workers."""
    spec.rdzv_endpoint = spec.rdzv_endpoint.strip()
    if spec.nodes == 1:
        if spec.node_rank:
            raise SpecError("node_rank", say("node_rank_too_big", rank=spec.node_rank, count=1, last=0))
        if spec.rdzv_endpoint:
            raise SpecError("rdzv_endpoint", say("nodes_one_machine"))
        return
    if spec.cluster:
        raise SpecError("nodes", say("nodes_not_on_cluster", count=spec.nodes))
    if not spec.rdzv_endpoint:
        raise SpecError("rdzv_endpoint", say("nodes_need_endpoint", count=spec.nodes))
    match = ENDPOINT.match(spec.rdzv_endpoint)
    if not match or not 0 < int(match.group(1)) < 65536:
        raise SpecError("rdzv_endpoint", say("rdzv_endpoint_invalid", value=spec.rdzv_endpoint))
    if spec.node_rank >= spec.nodes:
        raise SpecError("node_rank", say("node_rank_too_big", rank=spec.node_rank, count=spec.nodes,
                                         last=spec.nodes - 1))


def _check_sharding(spec: "JobSpec") -> None:
    """sharding fsdp: what does not train sharded yet is refused here (auto leaves such a job unsharded)."""
    if spec.sharding != "fsdp":
        return
    unsupported = "base_precision: fp8" if spec.base_precision == "fp8" else ""
    if unsupported:
        raise SpecError("sharding", say("sharding_unsupported", setting=unsupported))


def _check_preference(spec: "JobSpec") -> None:
    """The preference keys: beta must be positive; weights not both zero; a reference only where used."""
    if spec.method not in PREFERENCE_METHODS:
        return
    if spec.dataset_format != "auto":
        raise SpecError("dataset_format", say("sft_format_for_pairs", format=spec.dataset_format, method=spec.method))
    if spec.method != "orpo" and spec.beta <= 0:
        raise SpecError("beta", say("beta_positive", method=spec.method))
    if spec.method == "orpo" and spec.orpo_lambda <= 0:
        raise SpecError("orpo_lambda", say("orpo_lambda_positive"))
    if spec.method == "kto" and spec.kto_desirable_weight == 0 and spec.kto_undesirable_weight == 0:
        raise SpecError("kto_desirable_weight", say("kto_weights_zero"))
    if spec.precompute_reference and spec.method in REFERENCE_FREE_METHODS:
        raise SpecError("precompute_reference", say("no_reference_model", method=spec.method))


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or Path(value).suffix != ""


def _local_dataset(dataset: str) -> Path | None:
    """The file a dataset reference names; None for a built-in set or a hub id (checked when it loads)."""
    if dataset.startswith("builtin:") or not _looks_like_path(dataset):
        return None
    return Path(dataset).expanduser()


def _check_dataset_path(dataset: str, key: str = "dataset") -> None:
    """The reference's kind: a known built-in set, a hub id, or a file of a type we read (whether the
    file is still there is _check_run_inputs' question)."""
    if dataset.startswith("builtin:") and dataset not in BUILTIN_DATASETS:
        raise SpecError(key, say("unknown_builtin_dataset", dataset=dataset, choices=", ".join(BUILTIN_DATASETS)))
    path = _local_dataset(dataset)
    if path is not None and path.suffix.lower() not in DATASET_SUFFIXES:
        raise SpecError(key, say("dataset_type_unsupported", name=path.name, choices=", ".join(DATASET_SUFFIXES)))


def _check_run_inputs(spec: "JobSpec") -> None:
    """The files only a start reads are there: the data, the reward file, the checkpoint to resume from.
    A job that has run no longer reads them (its export reads the model, the adapter and the tokenizer),
    so JobSpec's `to_run=False` leaves this out: moving a reward file away must not lock an adapter in."""
    for key in ("dataset", "eval_dataset"):
        path = _local_dataset(getattr(spec, key))
        if path is not None and not path.is_file():
            raise SpecError(key, say("file_missing", path=path))
    if spec.resume_from and not Path(spec.resume_from).is_dir():
        raise SpecError("resume_from", say("not_checkpoint", path=spec.resume_from))
    reward_file = Path(spec.reward_file).expanduser()
    if spec.method == "grpo" and spec.reward_file and not reward_file.is_file():
        raise SpecError("reward_file", say("reward_file_missing", path=reward_file))


def _check_model_path(model: str) -> None:
    if model.startswith("builtin:"):
        if model != BUILTIN_MODEL:
            raise SpecError("model", say("unknown_builtin_model", model=model, builtin=BUILTIN_MODEL))
        return
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        if not path.is_file():
            raise SpecError("model", say("gguf_missing", path=path))
    elif model.startswith(("/", "./", "../", "~")):
        if not (path / "config.json").is_file():
            raise SpecError("model", say("not_hf_folder", path=path))


def _normalise_targets(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text in ("all-linear", ""):
            return "all-linear"
        text = text.removeprefix("[").removesuffix("]")  # "[q_proj, v_proj]" from a form or the CLI
        value = [part.strip().strip("'\"") for part in text.replace("\n", ",").split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError("target_modules", say("target_modules_empty"))
    names = [str(v).strip() for v in value]
    for name in names:
        if not name or set(name) - MODULE_NAME_CHARS:
            raise SpecError("target_modules", say("target_module_invalid", name=name))
    return names


def _normalise_report_to(value: Any) -> Any:
    """"none", or a list of trackers: "tensorboard, mlflow", [tensorboard] and "[wandb]" all work."""
    if isinstance(value, str):
        value = value.strip().removeprefix("[").removesuffix("]").replace(" ", ",").split(",")
    if not isinstance(value, (list, tuple)):
        raise SpecError("report_to", say("report_to_invalid", value=value, choices=", ".join(REPORT_TO[1:])))
    names = []
    for part in (str(v).strip().strip("'\"").lower() for v in value):
        if part and part not in REPORT_TO:
            raise SpecError("report_to", say("value_not_choice", value=part, choices=", ".join(REPORT_TO)))
        if part and part != "none" and part not in names:
            names.append(part)
    if "none" in [str(v).strip().lower() for v in value] and names:
        raise SpecError("report_to", say("report_to_none_and_more"))
    return names or "none"


def trackers(spec: "JobSpec") -> list[str]:
    """The trackers a job reports to ([] for none)."""
    return [] if spec.report_to == "none" else list(spec.report_to)


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
        raise SpecError("gpus", say("gpus_invalid", value=value))
    if len(set(parts)) != len(parts):
        raise SpecError("gpus", say("gpus_twice", value=value))
    return ",".join(str(int(part)) for part in parts)
