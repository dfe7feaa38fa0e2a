"""Models: resolve what the user picked to a loadable folder, load it (bf16/fp32, or 4-bit NF4 for
QLoRA), wrap it with PEFT LoRA, and load base + adapter for chat."""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from jobs.models import hub
from jobs.models.errors import ModelError  # noqa: F401  (raised here; callers import it from here too)
from jobs.io import paths
from jobs.models import builtin as smollm2
from jobs.models import vision
from jobs.spec import BUILTIN_MODEL, JobSpec


def resolve_model(model: str, data_dir: Path | None = None, log=print) -> str:
    """A local folder or hub id that `from_pretrained` can load. GGUF files (and the built-in
    model) are converted once to a cached safetensors folder under the data dir."""
    cache = paths.model_cache_dir(paths.data_dir(data_dir))
    if model == BUILTIN_MODEL:
        try:
            return str(smollm2.builtin_model_dir(cache, log=log))
        except smollm2.BuiltinModelMissing as exc:
            raise ModelError(str(exc)) from None
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist")
        stat = path.stat()
        key = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:10]
        return str(smollm2.convert_gguf(path, cache / f"{path.stem}-{key}", log=log))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} has no config.json: it is not a Hugging Face model folder")
        return str(path)
    if model.startswith(("/", "./", "../", "~")):
        raise ModelError(f"{model} is not a model folder (it does not exist)")
    return hub.resolve_hub_model(model)  # refuses at once what cannot load (offline, no such repo)


def load_config(source: str):
    """The model's transformers config (no weights)."""
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"could not read the config of {source!r}: {exc}") from None


def max_positions(config) -> int | None:
    """The longest sequence the model was built for (max_position_embeddings or its aliases)."""
    config = getattr(config, "text_config", None) or config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def linear_module_names(config) -> list[str]:
    """Dotted names of every nn.Linear in the model, built on the meta device (no weights
    loaded, no memory used), for checking target_modules before a job starts."""
    from transformers import AutoModelForCausalLM
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"cannot build this model's architecture to check target_modules: {exc}") from None
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def missing_targets(targets, linear_names: list[str], all_names: list[str] | None = None) -> list[str]:
    """The entries of target_modules that match no module, by PEFT's rule: a target matches a
    module whose dotted name equals it or ends with '.' + it."""
    if targets == "all-linear":
        return []
    names = all_names if all_names is not None else linear_names
    return [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]


def pick_dtype(spec: JobSpec, device: torch.device) -> torch.dtype:
    if spec.dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]


def load_tokenizer(source: str):
    from transformers import AutoTokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ModelError(f"could not load a tokenizer for {source!r}: {exc}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_base_model(source: str, dtype: torch.dtype, device: torch.device, load_in_4bit: bool = False,
                    sharded: bool = False):
    """A causal LM, or for a vision-language model (jobs/models/vision.py) the image-text model.

    `sharded` (a 4-bit base FSDP2 will split): the packed NF4 codes are stored in `dtype`, not uint8,
    as Answer.AI's FSDP-QLoRA does (`bnb_4bit_quant_storage`): FSDP2 makes each shard an
    `nn.Parameter`, which torch 2.11 refuses for an integer tensor (seen on the H200)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    config = load_config(source)
    reason = vision.refusal(config)
    if reason:
        raise ModelError(reason)
    auto_class = AutoModelForImageTextToText if vision.is_vision_config(config) else AutoModelForCausalLM
    kwargs = {"dtype": dtype}
    if load_in_4bit:
        from transformers import BitsAndBytesConfig
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype, **({"bnb_4bit_quant_storage": dtype} if sharded else {}))
        kwargs["device_map"] = {"": device.index or 0} if device.type == "cuda" else {"": "cpu"}
    try:
        model = auto_class.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"could not load model {source!r}: {exc}") from None
    if not load_in_4bit:
        model.to(device)
    elif device.type == "cpu":
        keep_cpu_4bit_trainable(model)
    return model


def keep_cpu_4bit_trainable(model) -> None:
    """Turn off bitsandbytes' CPU inference repack on every 4-bit linear.

    On CPUs with AVX512-BF16, bitsandbytes (0.50) repacks a Linear4bit's weights for a bf16 kernel
    the first time it runs in eval mode without grad, i.e. at the job's first eval pass. From
    then on its output is bf16-rounded (absmax stored in bf16; 0.15 off on a [64, 128] layer) and
    training steps after it send no gradient through the layer (seen on an AMD EPYC host), so
    the adapters below it stop learning. A job needs the same fp32 path in training and eval."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def add_lora(model, spec: JobSpec):
    from peft import LoraConfig, get_peft_model
    targets = spec.target_modules
    if vision.is_vision_config(model.config):   # the language model only, unless vision_lora (vision.py)
        linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
        targets = vision.lora_targets(linear, targets, spec.vision_lora)
        if not targets:
            raise ModelError(f"target_modules {spec.target_modules!r} match no linear layer of this model")
    config = LoraConfig(r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                        target_modules=targets, bias="none", task_type="CAUSAL_LM")
    try:
        peft = get_peft_model(model, config)
    except ValueError as exc:
        raise ModelError(f"target_modules {targets!r} do not fit this model: {exc}") from None
    # ready to train: from_pretrained left the base in eval mode (no layer checkpoints then) under a
    # PeftModel whose own flag reads training, the flag the training step's guard reads (jobs/train/loop.py)
    return peft.train()


def load_for_chat(model: str, adapter_dir: str | None, data_dir: Path | None = None):
    """(model, tokenizer) for generation; a PeftModel when an adapter is given, so the base
    answer is the same model under `base_model_only(model)` (jobs/models/adapter_switch.py)."""
    source = resolve_model(model, data_dir)
    tokenizer = load_tokenizer(adapter_dir if adapter_dir and _has_tokenizer(adapter_dir) else source)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base = load_base_model(source, dtype, device)
    if adapter_dir:
        from peft import PeftModel
        base = PeftModel.from_pretrained(base, adapter_dir)
    base.eval()
    return base, tokenizer


def _has_tokenizer(folder: str) -> bool:
    return (Path(folder) / "tokenizer_config.json").is_file()
