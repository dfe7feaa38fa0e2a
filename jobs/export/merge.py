"""`--format merged`: base + LoRA folded into one Hugging Face safetensors folder, streamed.

Base shards are opened one at a time with safetensors' `safe_open`; each weight the adapter
changes gets `scale * B @ A` added (in fp32, on the GPU when there is one) and the result is
written into output shards of at most `MAX_SHARD_BYTES`. So the process holds one output shard
and one tensor, never the model (bench/export_memory.py measures the peak).

A QLoRA job trained against NF4-quantized base weights; to reproduce what it learned on, its
linear weights are first sent through the same NF4 round trip (bitsandbytes' quantize_4bit /
dequantize_4bit, blocksize 64 with double quantization, as transformers' BitsAndBytesConfig
in jobs/models/load.py), i.e. the merge goes into the dequantized base."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch

from jobs.messages import say
from jobs.export import card
from jobs.export.files import ExportError, Progress, atomic_output, check_free_space, no_progress
from jobs.export.source import JobSource, TensorSpec
from jobs.io.layout import MODEL_CARD

MAX_SHARD_BYTES = 2 * 1000 ** 3
QLORA_NOTE = say("export_note_qlora")


def merge_device(choice: str = "auto") -> torch.device:
    """Where LoRA deltas are computed: the GPU when there is one (auto), or as asked."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ExportError(say("export_no_cuda"))
    return torch.device(choice)


def output_dtype(stored: torch.dtype, device: torch.device) -> torch.dtype:
    """bf16 when merging on a GPU, the base's own dtype otherwise; integer tensors stay as they are."""
    if not stored.is_floating_point:
        return stored
    return torch.bfloat16 if device.type == "cuda" else stored


def quantized_by_qlora(name: str, ndim: int) -> bool:
    """The weights bitsandbytes replaced with 4-bit ones: the decoder layers' linear weights
    (embeddings, norms and lm_head stay in full precision)."""
    return ndim == 2 and ".layers." in name and name.endswith(".weight")


def nf4_round_trip(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    try:
        from bitsandbytes import functional as bnb
    except ImportError:
        raise ExportError(say("export_qlora_needs_bnb")) from None
    packed, state = bnb.quantize_4bit(weight.to(dtype).contiguous(), blocksize=64,
                                      compress_statistics=True, quant_type="nf4")
    return bnb.dequantize_4bit(packed, state)


def fold(source: JobSource, spec: TensorSpec, weight: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One base tensor as the merged model stores it."""
    out_dtype = output_dtype(weight.dtype, device)
    pair = source.lora.get(spec.name)
    nf4 = source.qlora and quantized_by_qlora(spec.name, weight.dim())
    if pair is None and not nf4:
        return weight.to(out_dtype)
    work = weight.to(device)
    if nf4:
        work = nf4_round_trip(work, getattr(torch, source.train_dtype or "float32", torch.float32))
    work = work.to(torch.float32)
    if pair is not None:
        work += pair.delta(device)
    return work.to(out_dtype).cpu()


def merged_tensors(source: JobSource, device: torch.device | None = None
                   ) -> Iterator[tuple[TensorSpec, torch.Tensor]]:
    """(spec, merged tensor) for every base tensor, reading one base shard at a time."""
    from safetensors import safe_open
    device = device or merge_device(source.device)
    for shard in source.shards:
        with safe_open(str(shard), framework="pt") as reader:
            for spec in (t for t in source.tensors if t.shard == shard):
                yield spec, fold(source, spec, reader.get_tensor(spec.name), device)


def output_bytes(spec: TensorSpec, device: torch.device) -> int:
    numel = 1
    for dim in spec.shape:
        numel *= dim
    return numel * output_dtype(spec.dtype, device).itemsize


def shard_plan(tensors: list[TensorSpec], device: torch.device) -> list[list[str]]:
    """Tensor names per output shard, in order, each shard at most MAX_SHARD_BYTES (or one tensor)."""
    shards: list[list[str]] = [[]]
    size = 0
    for spec in tensors:
        nbytes = output_bytes(spec, device)
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(spec.name)
        size += nbytes
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def _save_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file
    save_file(tensors, str(path), metadata={"format": "pt"})


def write_weights(source: JobSource, folder: Path, device: torch.device, progress: Progress) -> dict:
    """Write the merged shards into folder; returns {tensor name: shard file}."""
    plan = shard_plan(source.tensors, device)
    names = shard_names(len(plan))
    total = sum(output_bytes(t, device) for t in source.tensors)
    weight_map, pending, done_bytes = {}, {}, 0
    stream = merged_tensors(source, device)
    for index, wanted in enumerate(plan):
        for spec, tensor in stream:
            pending[spec.name] = tensor.contiguous()
            done_bytes += output_bytes(spec, device)
            if len(pending) == len(wanted):
                break
        _save_shard(pending, folder / names[index])
        weight_map.update({name: names[index] for name in pending})
        pending = {}
        progress(done_bytes / max(total, 1), f"wrote {names[index]} ({index + 1}/{len(plan)})")
    if len(plan) > 1:
        index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2), encoding="utf-8")
    return weight_map


def merged_config(source: JobSource, device: torch.device) -> dict:
    """The base's config.json for full-precision weights in the dtype written."""
    config = dict(source.config)
    config.pop("quantization_config", None)
    floats = [t.dtype for t in source.tensors if t.dtype.is_floating_point]
    if floats:
        dtype_name = str(output_dtype(floats[0], device)).removeprefix("torch.")
        key = "torch_dtype" if "torch_dtype" in config and "dtype" not in config else "dtype"
        config[key] = dtype_name
    return config


def write_tokenizer(source: JobSource, folder: Path) -> None:
    """The tokenizer the job trained with (the adapter folder's copy, chat template included)."""
    from jobs.data.encode import ensure_chat_template
    from jobs.models.load import load_tokenizer
    tokenizer = load_tokenizer(str(source.adapter_dir))
    ensure_chat_template(tokenizer)
    tokenizer.save_pretrained(folder)
    processor = Path(source.adapter_dir) / "preprocessor_config.json"   # a vision-language job's image processor
    if processor.is_file():
        (folder / processor.name).write_bytes(processor.read_bytes())


def adapter_training(source: JobSource) -> str | None:
    """The training line of the merged adapter's own card (None: an adapter saved without one)."""
    adapter_card = Path(source.adapter_dir) / MODEL_CARD
    return card.adapter_training_line(adapter_card.read_text(encoding="utf-8")) if adapter_card.is_file() else None


def export_merged(source: JobSource, out: Path, progress: Progress = no_progress) -> tuple[Path, list[str]]:
    """Write the merged folder to `out` (atomically); returns (out, notes for the user)."""
    device = merge_device(source.device)
    check_free_space(out.parent, sum(output_bytes(t, device) for t in source.tensors))
    notes = [f"weights: {merged_config(source, device).get('dtype') or 'the base dtype'}, "
             f"merged on {device.type}"]
    if source.qlora:
        notes.append(QLORA_NOTE)
    with atomic_output(out, folder=True) as tmp:
        write_weights(source, tmp, device, progress)
        (tmp / "config.json").write_text(json.dumps(merged_config(source, device), indent=2), encoding="utf-8")
        generation = source.base_dir / "generation_config.json"
        if generation.is_file():
            (tmp / generation.name).write_bytes(generation.read_bytes())
        write_tokenizer(source, tmp)
        (tmp / "README.md").write_text(card.merged_card(source.spec, "merged", notes, adapter_training(source)),
                                       encoding="utf-8")
    progress(1.0, f"merged model in {out}")
    return out, notes
