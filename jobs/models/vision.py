"""Vision-language models: which ones Fusetune trains, their image processor, and where LoRA goes.

A model is vision-language when its config carries a `vision_config` (transformers' image-text
models: Qwen2-VL, Qwen2.5-VL, Gemma 3, SmolVLM/Idefics3, Llama 3.2 Vision, LLaVA...). Qwen2-VL and
Qwen2.5-VL are trained; the others are refused at preflight with the reason (their image-token
layout is not wired into jobs/data/vision_encode.py yet).

The image processor is always the PIL one (`Qwen2VLImageProcessorPil`): transformers' default for
Qwen2-VL is the torchvision-based fast processor, and PyPI's torchvision for the CPU torch build
fails to import (`operator torchvision::nms does not exist`), so nothing here imports torchvision.

Where LoRA goes follows ms-swift's rule for multimodal models: `all-linear` means the language
model's linear layers; the vision tower ("vit") and the projector ("aligner") stay frozen unless
`vision_lora: true` or the user names them with those aliases."""
from __future__ import annotations

from jobs.messages import say
from jobs.models.errors import ModelError

SUPPORTED = {"qwen2_vl": "Qwen2-VL", "qwen2_5_vl": "Qwen2.5-VL"}
# dotted-name markers of each part in transformers' image-text models (checked in this order)
PROJECTOR_MARKERS = (".merger.", "multi_modal_projector", ".connector.", "mm_projector")
VISION_MARKERS = (".visual.", "vision_tower", "vision_model", ".vision.")
ALIASES = {"vit": "vision", "aligner": "projector"}   # ms-swift's names for the two parts


def is_vision_config(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def refusal(config) -> str | None:
    """Why this vision-language model cannot be trained yet (None: it can, or it is a text model)."""
    if not is_vision_config(config):
        return None
    model_type = getattr(config, "model_type", "?")
    if model_type in SUPPORTED:
        return None
    return say("vision_model_unsupported", model_type=model_type, supported=", ".join(SUPPORTED.values()))


def load_image_processor(source: str):
    """The PIL image processor with the model's own preprocessing settings (preprocessor_config.json)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    try:
        return Qwen2VLImageProcessorPil.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ModelError(say("image_processor_unloadable", source=source, detail=exc)) from None


def image_token(tokenizer) -> tuple[str, int]:
    """(Qwen2-VL's image placeholder token, its id); refused when the tokenizer lacks it."""
    token = "<|image_pad|>"
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ModelError(say("tokenizer_no_image_token", token=token))
    return token, token_id


def part_of(name: str) -> str | None:
    """'language', 'vision' or 'projector' for a module's dotted name (None: the lm_head)."""
    if name == "lm_head" or name.endswith(".lm_head"):
        return None
    dotted = f".{name}."
    if any(marker in dotted for marker in PROJECTOR_MARKERS):
        return "projector"
    if any(marker in dotted for marker in VISION_MARKERS):
        return "vision"
    return "language"


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)   # PEFT's rule for a list of names


def lora_targets(linear_names: list[str], targets, vision_lora: bool) -> list[str]:
    """The full names of the linear layers that get LoRA (see the module docstring)."""
    trained_parts = {"language", "vision", "projector"} if vision_lora else {"language"}
    chosen = []
    for name in linear_names:
        part = part_of(name)
        if part is None:
            continue
        if targets == "all-linear":
            hit = part in trained_parts
        else:
            hit = any(ALIASES.get(t) == part for t in targets) or (
                part in trained_parts and any(_matches(name, t) for t in targets if t not in ALIASES))
        if hit:
            chosen.append(name)
    return chosen


def missing_targets(linear_names: list[str], targets) -> list[str]:
    """Entries of target_modules that match no linear layer (the aliases always match a part)."""
    if targets == "all-linear":
        return []
    return [t for t in targets if t not in ALIASES and not any(_matches(n, t) for n in linear_names)]


def part_counts(names: list[str]) -> dict[str, int]:
    counts = {"language": 0, "vision": 0, "projector": 0}
    for name in names:
        part = part_of(name)
        if part:
            counts[part] += 1
    return counts


def lora_line(chosen: list[str], linear_names: list[str]) -> str:
    """The kernel report's / job log's line: which parts got LoRA, per part 'got / linear layers'."""
    got, every = part_counts(chosen), part_counts(linear_names)
    parts = ", ".join(f"{part} {got[part]}/{every[part]}" for part in got if every[part])
    frozen = [part for part in got if every[part] and not got[part]]
    return f"LoRA modules: {parts}" + (f" ({' and '.join(frozen)} frozen)" if frozen else "")


class TokenizerWithImages:
    """The tokenizer, plus the image processor saved beside it: what a job saves with its adapter
    (tokenizer files and preprocessor_config.json) is what loads the tuned model again."""

    def __init__(self, tokenizer, image_processor):
        self.__dict__["_tokenizer"], self.__dict__["image_processor"] = tokenizer, image_processor

    def __getattr__(self, name):
        return getattr(self.__dict__["_tokenizer"], name)

    def __setattr__(self, name, value):
        setattr(self.__dict__["_tokenizer"], name, value)

    def __len__(self):
        return len(self._tokenizer)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def save_pretrained(self, folder, **kwargs):
        self.image_processor.save_pretrained(folder)
        return self._tokenizer.save_pretrained(folder, **kwargs)


def lora_report(peft_model) -> str:
    """lora_line for a PEFT-wrapped model: its LoRA layers against every linear layer it has."""
    import torch
    chosen, linear = [], []
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "base_layer"):
            chosen.append(name)
            linear.append(name)
        elif isinstance(module, torch.nn.Linear) and not any(
                f".{piece}" in name for piece in ("lora_A", "lora_B", "base_layer")):
            linear.append(name)
    return lora_line(chosen, linear)
