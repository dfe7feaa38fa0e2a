"""`--format adapter`: the PEFT zip, plus the LoRA as a GGUF adapter for `llama.cpp --lora`
(`llama-cli -m base.gguf --lora adapter.gguf`) when the base is in a supported family.

Written as llama.cpp's convert_lora_to_gguf.py does: general.type = adapter, adapter.type = lora,
adapter.lora.alpha; for each adapted base weight `<gguf name>.lora_a` (r x in) and `.lora_b`
(out x r) in F32; llama-family q/k B matrices get the same row permutation as the base weights
(P(W + s·B·A) = P·W + s·(P·B)·A). llama.cpp scales by alpha / r, so an rsLoRA adapter is written
with the alpha that gives its scale."""
from __future__ import annotations

import json
from pathlib import Path

import gguf

from jobs.messages import say
from jobs.export import card, families
from jobs.export.adapter import export_adapter_zip
from jobs.export.files import ExportError, ExportResult, Progress, atomic_output, no_progress
from jobs.export.job_config import exported_spec
from jobs.export.source import LoraPair, locate_base, read_lora
from jobs.io.layout import JobLayout
from jobs.spec import JobSpec, short_name


def lora_gguf_path(zip_path: Path) -> Path:
    return zip_path.with_suffix(".gguf")


def effective_alpha(pairs: dict[str, LoraPair]) -> float:
    """The alpha for which llama.cpp's alpha / r equals the adapter's scale."""
    alphas = {round(p.scale * p.a.shape[0], 6) for p in pairs.values()}
    if len(alphas) != 1:
        raise ExportError(say("export_lora_scales_differ"))
    return alphas.pop()


def write_lora_gguf(target: Path, spec: JobSpec, config: dict, pairs: dict[str, LoraPair]) -> Path:
    family = families.family_of(config)
    names = families.TensorNames(family, config)
    writer = gguf.GGUFWriter(None, family.arch_name)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, effective_alpha(pairs))
    writer.add_name(f"{spec.name or short_name(spec.model)} LoRA (Fusetune)")
    base = card.hub_id(spec.model)
    if base:
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, base)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for hf_name in sorted(pairs, key=_layer_order):
        gguf_name = names.gguf_name(hf_name)
        if gguf_name is None:
            continue
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            raise ExportError(say("export_tied_lm_head"))
        pair, heads = pairs[hf_name], families.qk_heads(family, config, hf_name)
        lora_b = families.permute_rows(pair.b, heads) if heads else pair.b
        writer.add_tensor(f"{gguf_name}.lora_a", pair.a.float().contiguous().numpy())
        writer.add_tensor(f"{gguf_name}.lora_b", lora_b.float().contiguous().numpy())
    with atomic_output(target, folder=False) as tmp:
        try:
            writer.write_header_to_file(path=tmp)
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return target


def _layer_order(name: str) -> tuple:
    parts = name.split(".")
    return tuple(int(p) if p.isdigit() else 0 for p in parts), name


def export_adapter(job_dir: Path, zip_path: Path, data_dir=None, progress: Progress = no_progress,
                   log=print) -> ExportResult:
    """The zip, and beside it the llama.cpp LoRA GGUF when the base family allows (else a note why not)."""
    progress(0.0, "zipping the adapter")
    archive = export_adapter_zip(job_dir, zip_path)
    result = ExportResult([archive])
    try:
        layout = JobLayout(job_dir)
        spec = exported_spec(layout.root)
        start = _start_source(layout)
        config = json.loads((locate_base(spec, start, data_dir, log) / "config.json").read_text(encoding="utf-8"))
        pairs, _ = read_lora(layout.adapter)
        progress(0.5, "writing the LoRA as a llama.cpp GGUF adapter")
        result.files.append(write_lora_gguf(lora_gguf_path(archive), spec, config, pairs))
    except (ExportError, OSError) as exc:
        result.notes.append(say("export_note_no_lora_gguf", message=exc))
    progress(1.0, f"adapter in {archive}")
    return result


def _start_source(layout: JobLayout) -> str | None:
    from jobs.io.events import summarize
    return (summarize(layout.root).start or {}).get("source")
