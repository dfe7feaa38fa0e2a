"""Data-parallel scaling of a real job: `python -m jobs.train` on 1 GPU and on 2 GPUs (DDP through
torchrun), Llama-3.1-8B shape, bs 2 x 2048 per GPU, fused engine, checkpointing auto.

Both runs see the same global batch (4 rows of 2048 tokens a step): one GPU with batch 2 and
gradient accumulation 2, two GPUs with batch 2 each. So tokens/s compares the same work per GPU,
and the loss of every step must agree (issue 10: tokens/s on 2 GPUs >= 1.9x one GPU, first-step
loss equal within 1e-3 relative). Weights: random init bf16 built on the GPU from the BASELINES.md
config and saved once; data: random words (labels = inputs, text format) truncated to 2048 tokens
by the tiny test tokenizer (its ids index the first rows of the 128256-row embedding, which costs
the same). `--offload-check` adds a short 2-GPU run with checkpointing offload, whose losses must
match too (DDP hooks inside the offloaded layers' nested backward on CUDA). `--cpu-smoke` runs the
same pipeline on the tiny test model with 1 and 2 CPU processes (to check this script, not to
measure).

    python bench/ddp_bench.py --work /tmp/ddp --out $OUT/ddp.jsonl [--steps 12] [--offload-check]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PER_GPU_BATCH, WARMUP_STEPS = 2, 3
SEQ = 2048


def build(work: Path, rows: int) -> Path:
    """A random-init Llama-3.1-8B-shape folder (bf16 safetensors + tiny tokenizer) and the data."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from bench.bench_lora import SHAPES
    from tests.tiny import make_tokenizer
    folder = work / "llama-3.1-8b-random"
    if not (folder / "config.json").is_file():
        shape, tokenizer = dict(SHAPES["llama-3.1-8b"]), make_tokenizer()
        config = AutoConfig.for_model(shape.pop("model_type"), **shape, bos_token_id=tokenizer.bos_token_id,
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(folder, safe_serialization=True)
        del model
        torch.cuda.empty_cache()
        tokenizer.save_pretrained(folder)
    write_data(work, rows)
    return folder


def write_data(work: Path, rows: int) -> None:
    """Rows of random words, each far longer than SEQ tokens (so every row is truncated to SEQ)."""
    data = work / "random-words.jsonl"
    rng = random.Random(0)
    with open(data, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            words = ("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
                     for _ in range(3000))
            fh.write(json.dumps({"text": " ".join(words)}) + "\n")


def run_job(name: str, work: Path, model: Path, log, steps: int, where: list[str], accumulation: int,
            checkpointing: str = "auto", timeout_s: int = 300) -> dict:
    """One `python -m jobs.train` run (`where`: --gpus 0,1 or, for the CPU smoke test, --processes 2)."""
    out = work / name
    argv = [sys.executable, "-m", "jobs.train", "--model", str(model), "--dataset", str(work / "random-words.jsonl"),
            "--dataset_format", "text", "--output_dir", str(out), "--max_steps", str(steps),
            "--max_seq_length", str(SEQ), "--batch_size", str(PER_GPU_BATCH),
            "--gradient_accumulation_steps", str(accumulation), *where, "--fused_kernels", "true",
            "--gradient_checkpointing", checkpointing, "--lora_r", "16", "--lora_alpha", "16",
            "--learning_rate", "1e-4", "--save_steps", "0", "--packing", "off", "--seed", "0"]
    began = time.time()
    log.write(f"\n===== {name}: {' '.join(argv)}\n")
    log.flush()
    # its own session, so a timeout ends torchrun's ranks too (they hold the GPUs)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = f"timed out after {timeout_s}s"
        proc.wait()
    from jobs.io.events import summarize
    summary = summarize(out)
    return {"name": name, "exit_code": code, "wall_s": round(time.time() - began, 1),
            "start": summary.start or {}, "steps": summary.steps, "final": summary.final}


def describe(result: dict) -> dict:
    steps = result["steps"]
    timed = steps[WARMUP_STEPS:] or steps
    start = result["start"]
    return {
        "run": result["name"], "exit_code": result["exit_code"], "wall_s": result["wall_s"],
        "processes": start.get("processes"), "global_batch": start.get("global_batch"),
        "steps": len(steps), "tokens_per_s": round(statistics.median(s["tokens_per_s"] for s in timed), 1)
        if timed else None,
        "first_step_loss": steps[0]["loss"] if steps else None,
        "losses": [round(s["loss"], 6) for s in steps],
        "peak_gb_rank0": steps[-1].get("peak_gb") if steps else None,
        "real_tokens_per_step": steps[-1].get("tokens") if steps else None,
        "gpus_in_step_events": [g["index"] for g in steps[-1].get("gpus", [])] if steps else [],
        "patch_report": start.get("patch_report"),
        "error": result["final"].get("message") if result["final"] and result["final"]["type"] == "error" else None,
    }


def placements(cpu: bool) -> tuple[list[str], list[str]]:
    """The jobs.train arguments for the 1- and 2-GPU runs: GPUs by number where NVML reads them
    (the studio's way), else processes on the GPUs CUDA shows (a machine without nvidia-ml-py)."""
    if cpu:
        return ["--processes", "1"], ["--processes", "2"]
    from jobs.io.gpus import read_gpus
    if len(read_gpus()) >= 2:
        return ["--gpus", "0"], ["--gpus", "0,1"]
    print("note: NVML reads fewer than 2 GPUs here; placing by --processes on CUDA's devices", flush=True)
    return ["--processes", "1"], ["--processes", "2"]


def environment(shape: str) -> dict:
    import torch
    import transformers
    import triton
    import peft
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "gpu_count": torch.cuda.device_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "python": platform.python_version(),
            "config": {"shape": shape, "seq": SEQ, "batch_per_gpu": PER_GPU_BATCH, "lora_r": 16,
                       "lora_alpha": 16, "fused_kernels": True, "checkpointing": "auto", "dtype": "bf16"}}


def compare(one: dict, two: dict, speed: bool = True) -> dict:
    """Loss agreement step by step (and the tokens/s ratio) of a 1-GPU and a 2-GPU run."""
    pairs = list(zip(one["losses"], two["losses"]))
    rel = [abs(a - b) / abs(a) for a, b in pairs if a]
    first = rel[0] if rel else None
    row = {"first_step_loss_rel_diff": first, "max_step_loss_rel_diff": max(rel) if rel else None,
           "steps_compared": len(rel), "pass_first_loss_1e-3": bool(first is not None and first < 1e-3)}
    if speed:
        ratio = two["tokens_per_s"] / one["tokens_per_s"] if one["tokens_per_s"] and two["tokens_per_s"] else None
        row.update(speedup_2_over_1=round(ratio, 3) if ratio else None, pass_speedup_1_9x=bool(ratio and ratio >= 1.9))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="/tmp/ddp-bench")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--offload-check", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=430, help="stop starting runs past this")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model, CPU processes: checks the script")
    args = parser.parse_args()
    global SEQ
    one_place, two_place = placements(args.cpu_smoke)
    if args.cpu_smoke:
        SEQ = 64
    began, work, out = time.time(), Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    log = open(out.with_suffix(".log"), "a", encoding="utf-8")
    env = environment("tiny (CPU smoke)" if args.cpu_smoke else "llama-3.1-8b")

    def emit(row: dict) -> None:  # one line as soon as it is known: a timeout keeps the rest
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({**env, **row}) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "patch_report"})[:700], flush=True)

    def left() -> int:
        return int(args.deadline_s - (time.time() - began))

    if args.cpu_smoke:
        from tests.tiny import make_tiny_model
        model = make_tiny_model(work / "tiny")
        write_data(work, rows=4 * args.steps + 8)
    else:
        model = build(work, rows=4 * args.steps + 8)
    print(f"built in {time.time() - began:.0f}s", flush=True)
    one = describe(run_job("1gpu", work, model, log, args.steps, one_place, 2, timeout_s=left()))
    emit(one)
    two = describe(run_job("2gpu", work, model, log, args.steps, two_place, 1, timeout_s=left()))
    emit(two)
    emit({"run": "compare", **compare(one, two)})
    if args.offload_check and left() > 90:
        off = describe(run_job("2gpu-offload", work, model, log, 4, two_place, 1, "offload", timeout_s=left()))
        emit(off)
        emit({"run": "compare-offload", **compare(one, off, speed=False)})
    print(f"total {time.time() - began:.0f}s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
