"""`--format gguf`: the merged model as one GGUF file for llama.cpp, with an Ollama Modelfile beside it.

Streamed like the merged export: tensor infos (names, shapes, types, sizes) come from the base's
shard headers, so the GGUF header is written first with the gguf package's GGUFWriter, then each
merged tensor is converted and appended as it comes (`write_tensor_data`), never the whole model.

Tensor types follow convert_hf_to_gguf.py: norms, biases and other 1-D tensors F32; matrices in
the asked type, F16 where Q8_0's 32-wide blocks do not divide a row. Q8_0 is computed by the gguf
package's quants module (in row chunks, to bound memory); BF16 by torch's round-to-nearest-even
cast, which is the same rounding."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from jobs.models import builtin as smollm2
from jobs.export import card, families, ollama, vocab
from jobs.export.files import ExportResult, Progress, check_free_space, no_progress, staged_folder
from jobs.export.merge import merge_device, merged_tensors
from jobs.export.source import JobSource
from jobs.messages import say
from jobs.spec import BUILTIN_MODEL, short_name

QTYPES = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
          "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPES = {"f16": gguf.LlamaFileType.MOSTLY_F16, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
QUANT_CHUNK_ELEMENTS = 1 << 24


@dataclass
class Planned:
    hf_name: str
    gguf_name: str
    shape: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    heads: int | None  # rows permuted over this many heads (llama q/k), or None

    @property
    def nbytes(self) -> int:
        return int(np.prod(gguf.quant_shape_to_byte_shape(self.shape, self.qtype)))


def tensor_type(gguf_name: str, shape: tuple[int, ...], quant: str) -> gguf.GGMLQuantizationType:
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32
    qtype = QTYPES[quant]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return qtype if shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16


def plan(source: JobSource, family: families.Family, quant: str) -> list[Planned]:
    """Every tensor the file will hold, in writing order (extras first, then the base's order)."""
    names = families.TensorNames(family, source.config)
    planned = [Planned(name, name, tuple(t.shape), gguf.GGMLQuantizationType.F32, None)
               for name, t in families.extra_tensors(family, source.config)]
    tied = source.config.get("tie_word_embeddings", False)
    for spec in source.tensors:
        gguf_name = names.gguf_name(spec.name)
        if gguf_name is None or (tied and spec.name == "lm_head.weight"):
            continue
        planned.append(Planned(spec.name, gguf_name, spec.shape, tensor_type(gguf_name, spec.shape, quant),
                               families.qk_heads(family, source.config, spec.name)))
    return planned


def encode(tensor: torch.Tensor, entry: Planned) -> np.ndarray:
    """A merged tensor in the file's layout and type."""
    if entry.heads:
        tensor = families.permute_rows(tensor, entry.heads)
    if entry.qtype == gguf.GGMLQuantizationType.F32:
        return tensor.to(torch.float32).numpy()
    if entry.qtype == gguf.GGMLQuantizationType.F16:
        return tensor.to(torch.float16).numpy()
    if entry.qtype == gguf.GGMLQuantizationType.BF16:
        return tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint8)
    rows = tensor.reshape(-1, tensor.shape[-1])
    out = np.empty(gguf.quant_shape_to_byte_shape(rows.shape, entry.qtype), dtype=np.uint8)
    step = max(1, QUANT_CHUNK_ELEMENTS // rows.shape[1])
    for start in range(0, rows.shape[0], step):
        chunk = rows[start:start + step].to(torch.float32).numpy()
        out[start:start + step] = gguf.quants.quantize(chunk, entry.qtype)
    return out.reshape(gguf.quant_shape_to_byte_shape(entry.shape, entry.qtype))


def source_gguf(source: JobSource) -> Path | None:
    """The GGUF file the base came from, whose tokenizer keys the export keeps."""
    if source.spec.model == BUILTIN_MODEL:
        return smollm2.gguf_path()
    if source.spec.model.endswith(".gguf"):
        return Path(source.spec.model).expanduser()
    return None


def add_general(writer: gguf.GGUFWriter, source: JobSource) -> None:
    spec = source.spec
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(spec.name or f"{short_name(spec.model)} fine-tuned with Fusetune")
    writer.add_basename(short_name(spec.model))
    writer.add_finetune("fusetune")
    base = card.hub_id(spec.model)
    if base:
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, base)
        writer.add_base_model_repo_url(0, f"https://huggingface.co/{base}")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def build_writer(source: JobSource, family: families.Family, quant: str, entries: list[Planned]
                 ) -> tuple[gguf.GGUFWriter, list[str]]:
    """A GGUFWriter holding every key and tensor info (no data yet), and notes for the user."""
    writer = gguf.GGUFWriter(None, family.arch_name)
    add_general(writer, source)
    families.add_hparams(writer, family, source.config, FILE_TYPES[quant])
    embeddings = next(e for e in entries if e.gguf_name == "token_embd.weight")
    notes = vocab.add_tokenizer(writer, source.adapter_dir, embeddings.shape[0], source_gguf(source))
    for entry in entries:
        writer.add_tensor_info(entry.gguf_name, entry.shape, np.dtype(np.float32), entry.nbytes, raw_dtype=entry.qtype)
    return writer, notes


def stream_entries(source: JobSource, family: families.Family, entries: list[Planned]):
    """(planned entry, merged tensor) in writing order."""
    by_name = {e.hf_name: e for e in entries}
    for name, tensor in families.extra_tensors(family, source.config):
        yield by_name[name], tensor
    for spec, tensor in merged_tensors(source, merge_device(source.device)):
        if spec.name in by_name:
            yield by_name[spec.name], tensor


def write_file(source: JobSource, family: families.Family, quant: str, entries: list[Planned],
               target: Path, progress: Progress) -> list[str]:
    """Write the GGUF to `target` (a path in export_gguf's temporary folder); notes for the user."""
    writer, notes = build_writer(source, family, quant, entries)
    total, done = sum(e.nbytes for e in entries), 0
    try:
        writer.write_header_to_file(path=target)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, (entry, tensor) in enumerate(stream_entries(source, family, entries)):
            writer.write_tensor_data(encode(tensor, entry))
            done += entry.nbytes
            if index % 16 == 0 or done == total:
                progress(0.98 * done / total, f"wrote {entry.gguf_name} ({index + 1}/{len(entries)})")
    finally:
        writer.close()
    return notes


def export_gguf(source: JobSource, target: Path, quant: str, progress: Progress = no_progress) -> ExportResult:
    """Write `target` (.gguf) and an Ollama Modelfile in the same folder, both or neither: the
    Modelfile is made first (nothing is written when it cannot be), then the two files are written
    into a temporary folder that becomes the destination only when both are complete."""
    family = families.family_of(source.config)
    entries = plan(source, family, quant)
    generation_file = source.base_dir / "generation_config.json"
    generation = json.loads(generation_file.read_text(encoding="utf-8")) if generation_file.is_file() else {}
    modelfile, template_notes = ollama.modelfile_for(target.name, source.adapter_dir, source.config, generation)
    check_free_space(target.parent, sum(e.nbytes for e in entries))
    with staged_folder(target.parent) as folder:
        notes = write_file(source, family, quant, entries, folder / target.name, progress)
        (folder / "Modelfile").write_text(modelfile, encoding="utf-8")
    if source.qlora:
        from jobs.export.merge import QLORA_NOTE
        notes.append(QLORA_NOTE)
    fallback = [e.gguf_name for e in entries if e.qtype == gguf.GGMLQuantizationType.F16 and quant != "f16"]
    if fallback:
        notes.append(say("export_note_f16_tensors", count=len(fallback), quant=quant, tensor=fallback[0]))
    progress(1.0, f"GGUF in {target}")
    return ExportResult([target, target.parent / "Modelfile"], notes + template_notes)
