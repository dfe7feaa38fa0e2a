"""Time to the first step, and peak memory, of a job on a big generated dataset: first with an empty
tokenized cache (jobs/data/cache.py builds it), then again on the same data (it reuses it).

Since issue 40 item 11 a job whose max_steps use few of the file's rows (this one: 2 steps of 8) reads
and checks every row but tokenizes only its sample (jobs/data/first_rows.py), and builds no cache: both
runs then say "cache": "sampled". `--max-steps 0` (epochs) measures the full build and its reuse.

    python bench/dataset_scale.py [--rows 804356] [--out bench/results/dataset_scale.jsonl]

A tiny random Llama trains, with the built-in model's tokenizer (SmolLM2's, from the data dir) when it
is there, so the time is the data's, not the model's. Memory is the peak RSS of the job's whole process
tree (the tokenizing workers included), sampled every 0.2 s. The machine's load average is recorded:
on a shared machine the figures are what this process got, not what the cores can do; `job_cpu_s` (the
CPU seconds of the job and its workers, to its end two steps later) over the cores is what an idle
machine would take at best (`idle_estimate_s`)."""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORDS = "the capital of france is paris and a river runs through it with many bridges over water".split()


def generate(path: Path, rows: int) -> None:
    """~250 bytes a row of short two-turn chats (the issue's 200 MB file had 804,356 rows)."""
    rng = random.Random(0)
    with open(path, "w") as fh:
        for i in range(rows):
            q = " ".join(rng.choice(WORDS) for _ in range(14))
            a = " ".join(rng.choice(WORDS) for _ in range(16))
            fh.write(json.dumps({"messages": [{"role": "user", "content": f"Question {i}: {q}?"},
                                              {"role": "assistant", "content": f"Answer {i}: {a}."}]}) + "\n")


def tiny_model(folder: Path) -> tuple[Path, str]:
    from jobs.io import paths
    smol = paths.model_cache_dir(paths.data_dir()) / "smollm2-135m-instruct"
    if not (smol / "tokenizer.json").is_file():
        from tests.tiny import make_tiny_model
        return make_tiny_model(folder), "tiny BPE (tests/tiny.py)"
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(smol)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, "SmolLM2-135M-Instruct's"


def run_job(work: Path, name: str, model: Path, dataset: Path, limit_s: float, max_steps: int = 2) -> dict:
    out = work / name
    config = {"model": str(model), "dataset": str(dataset), "output_dir": str(out), "max_steps": max_steps,
              "batch_size": 8, "max_seq_length": 256, "save_steps": 0, "packing": "off"}
    (work / f"{name}.yaml").write_text(yaml.safe_dump(config))
    started, cpu_before = time.monotonic(), _children_cpu_s()
    proc = subprocess.Popen([sys.executable, "-m", "jobs.train", str(work / f"{name}.yaml"),
                             "--data-dir", str(work / "data")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, first_step = 0, None
    events = out / "events.jsonl"
    while proc.poll() is None and time.monotonic() - started < limit_s:
        peak = max(peak, _tree_rss(proc.pid))
        if first_step is None and events.is_file() and '"type": "step"' in events.read_text():
            first_step = time.monotonic() - started
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    log = (out / "train.log").read_text() if (out / "train.log").is_file() else ""
    # CPU seconds of the job and every process it waited for (its tokenizing workers): what the
    # work costs whatever else the machine runs; / cores is the wall time on an idle machine, at best
    cpu_s = _children_cpu_s() - cpu_before
    cache = ("reused" if "tokenized cache: reusing" in log else
             "sampled" if "rows read and checked" in log else "built")
    # the build runs one worker a core; the sampled path reads in the job's one thread: no division
    cores = len(os.sched_getaffinity(0)) if cache == "built" else 1
    return {"time_to_first_step_s": round(first_step, 1) if first_step else None,
            "job_cpu_s": round(cpu_s, 1), "idle_estimate_s": round(cpu_s / cores, 1),
            "peak_rss_mb": round(peak / 2**20), "exit": proc.returncode, "cache": cache,
            "error": None if proc.returncode == 0 else (proc.stderr.read() or "")[-300:]}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=804_356)
    parser.add_argument("--limit-s", type=float, default=1800)
    parser.add_argument("--max-steps", type=int, default=2, help="0: epochs, every row tokenized (the cache)")
    parser.add_argument("--out", default=str(ROOT / "bench/results/dataset_scale.jsonl"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dataset_scale_") as tmp:
        work = Path(tmp)
        dataset = work / "big.jsonl"
        generate(dataset, args.rows)
        model, tokenizer = tiny_model(work / "model")
        common = {"bench": "dataset_scale", "rows": args.rows, "max_steps": args.max_steps,
                  "file_mb": round(dataset.stat().st_size / 1e6, 1),
                  "tokenizer": tokenizer, "cpus": len(os.sched_getaffinity(0)), "date": time.strftime("%Y-%m-%d")}
        for name in ("first", "second"):
            load = os.getloadavg()[0]
            row = {**common, "run": name, "load_avg_1m_before": round(load, 1),
                   **run_job(work, name, model, dataset, args.limit_s, args.max_steps)}
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
