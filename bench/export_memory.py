"""Peak RAM of `python -m jobs.export` on a model of a real shape (issue 9: an 8B-shape export must
peak at <= 1.3 x the merged model's size).

Builds, once, a random bf16 checkpoint of the named shape on disk (5 GB shards with an index, as
the hub ships them) and a finished-job folder around it with a LoRA r=16 adapter on all seven
linear targets. Then runs each export in a subprocess and records its peak resident memory: the
kernel's own high-water mark (`ru_maxrss` from wait4, every page counted, file-backed mmap pages of
the shard being read included) and, sampled every 0.2 s from /proc, the anonymous part (memory the
process owns, without the reclaimable page-cache pages of the mapped input shard). One JSON line
per export goes to bench/results/export_memory.jsonl.

    python bench/export_memory.py --shape llama-3.1-8b --workdir /tmp/export-bench \
        --exports merged gguf:q8_0 gguf:f16

Needs about 2.1x the model size of free disk (base + one export at a time; each export is deleted
after it is measured unless --keep-exports). No GPU needed; on a GPU machine the merge runs there.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_lora import SHAPES, TARGETS  # noqa: E402

SHARD_BYTES = 5 * 1000 ** 3
RESULTS = ROOT / "bench" / "results" / "export_memory.jsonl"


def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """HF llama/qwen2 parameter names and shapes for a config dict, in checkpoint order."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    shapes = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                   (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                   (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                   (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                   (p + "mlp.down_proj.weight", (h, inter))]
        if cfg["model_type"] == "qwen2":
            shapes += [(p + f"self_attn.{n}_proj.bias", (d,)) for n, d in (("q", q), ("k", kv), ("v", kv))]
    shapes.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings"):
        shapes.append(("lm_head.weight", (cfg["vocab_size"], h)))
    return shapes


def build_base(folder: Path, shape: str) -> int:
    """Write the random bf16 checkpoint; returns its size in bytes."""
    from safetensors.torch import save_file
    from transformers import AutoConfig
    cfg = dict(SHAPES[shape])
    shapes = tensor_shapes(cfg)
    total = sum(2 * torch.Size(s).numel() for _, s in shapes)
    if (folder / "config.json").is_file():
        return total
    folder.mkdir(parents=True, exist_ok=True)
    groups, size = [[]], 0
    for name, s in shapes:
        nbytes = 2 * torch.Size(s).numel()
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((name, s))
        size += nbytes
    weight_map, generator = {}, torch.Generator().manual_seed(0)
    for index, group in enumerate(groups, 1):
        file = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: torch.empty(s, dtype=torch.bfloat16).normal_(0, 0.02, generator=generator)
                   for name, s in group}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        del tensors
        print(f"wrote {file}", flush=True)
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc))
    model_type = cfg.pop("model_type")
    AutoConfig.for_model(model_type, dtype="bfloat16", **cfg).save_pretrained(folder)
    return total


def build_job(job: Path, base: Path, shape: str, rank: int = 16) -> None:
    """A finished-job folder: config.yaml, a start event naming the base, a LoRA adapter."""
    from safetensors.torch import save_file

    from jobs.io.events import EventWriter
    from jobs.spec import JobSpec
    from tests.tiny import make_tokenizer
    if (job / "adapter" / "adapter_model.safetensors").is_file():
        return
    (job / "adapter").mkdir(parents=True, exist_ok=True)
    JobSpec(model=str(base), output_dir=str(job), lora_r=rank, lora_alpha=2 * rank).write_yaml(job / "config.yaml")
    EventWriter(job).emit("start", model=str(base), source=str(base), dtype="bfloat16")
    generator, weights = torch.Generator().manual_seed(1), {}
    for name, s in tensor_shapes(dict(SHAPES[shape])):
        if len(s) == 2 and name.split(".")[-2] in TARGETS:
            stem = "base_model.model." + name.removesuffix(".weight")
            weights[stem + ".lora_A.weight"] = torch.randn(rank, s[1], generator=generator) * 0.01
            weights[stem + ".lora_B.weight"] = torch.randn(s[0], rank, generator=generator) * 0.01
    save_file(weights, str(job / "adapter" / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": TARGETS, "base_model_name_or_path": str(base), "lora_dropout": 0.0,
              "bias": "none"}
    (job / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    make_tokenizer().save_pretrained(job / "adapter")


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(job: Path, fmt: str, quant: str, out: Path) -> dict:
    """Run one export; its peak RSS (kernel high-water mark) and sampled peak anonymous RSS."""
    command = [sys.executable, "-m", "jobs.export", str(job), "--format", fmt, "--quant", quant, "--out", str(out)]
    began = time.time()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_anon, peak_file, stop = [0], [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak_anon[0] = max(peak_anon[0], _status_kb(proc.pid, "RssAnon"))
            peak_file[0] = max(peak_file[0], _status_kb(proc.pid, "RssFile"))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    stop.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"export failed ({proc.returncode}):\n{output[-3000:]}")
    from jobs.export.files import tree_size
    size = tree_size(out.parent if fmt == "gguf" else out)
    return {"seconds": round(time.time() - began, 1), "output_bytes": size,
            "peak_rss_bytes": usage.ru_maxrss * 1024, "peak_anon_bytes_sampled": peak_anon[0] * 1024,
            "peak_file_bytes_sampled": peak_file[0] * 1024, "tail": output.strip().splitlines()[-3:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--workdir", default="/tmp/fusetune-export-bench")
    parser.add_argument("--exports", nargs="+", default=["merged", "gguf:q8_0"])
    parser.add_argument("--keep-exports", action="store_true")
    args = parser.parse_args()
    work = Path(args.workdir)
    base, job = work / f"{args.shape}-base", work / f"{args.shape}-job"
    base_bytes = build_base(base, args.shape)
    build_job(job, base, args.shape)
    import transformers
    for spec in args.exports:
        fmt, _, quant = spec.partition(":")
        out = work / "out" / (f"{fmt}-{quant}" if fmt == "gguf" else fmt)
        target = out / "model.gguf" if fmt == "gguf" else out
        shutil.rmtree(work / "out", ignore_errors=True)
        row = {"bench": "export_memory", "machine": platform.node(), "cpus": os.cpu_count(),
               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
               "torch": torch.__version__, "transformers": transformers.__version__, "shape": args.shape,
               "format": fmt, "quant": quant or None, "base_bytes": base_bytes,
               **measure(job, fmt, quant or "f16", target)}
        merged_bytes = base_bytes  # bf16 in, bf16 out: the merged model's size
        row["merged_bytes"] = merged_bytes
        row["peak_over_merged"] = round(row["peak_rss_bytes"] / merged_bytes, 3)
        row["anon_peak_over_merged"] = round(row["peak_anon_bytes_sampled"] / merged_bytes, 3)
        print(json.dumps(row), flush=True)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if not args.keep_exports:
            shutil.rmtree(work / "out", ignore_errors=True)


if __name__ == "__main__":
    main()
