"""A real job, end to end: the same chat data, LoRA config and tokens per step through
(a) `python -m jobs.train` with the fused engine and packing auto,
(b) `python -m jobs.train` with fused kernels off and packing off (length-grouped batches, gradient
    accumulation to the same tokens per step),
(c) Unsloth + TRL SFTTrainer with packing (bench/bench_job_unsloth.py, its own process).

Data, tokenizer and models: bench/job_data.py. LoRA r 16, alpha 16, dropout 0 on q,k,v,o,gate,up,
down; AdamW lr 1e-4; max length 4096; `--rows` packed rows of 4096 tokens a step. Measured over the
steps after `--warmup` (compilation, autotuning and the allocator's first growth excluded): real
(non-pad) tokens/s, mean GPU utilisation (NVML, sampled at 10 Hz by this process, over the same
window), peak GiB (max_memory_allocated), final loss. One JSON line a run in --out.

    python bench/bench_job.py prepare --shape llama-3.2-1b --dir /tmp/bj
    python bench/bench_job.py run --stack fusetune --shape llama-3.2-1b --dir /tmp/bj --rows 4
    python bench/bench_job.py smoke        # CPU: the whole path on a tiny model (no GPU needed)

Preference tuning (issue 19): `--method dpo|orpo` trains about `--pairs` pairs a step (packed:
rows holding as many tokens) from
bench/pref_data.py's long-tailed pairs (prompt ~80, answers ~180 tokens a side, tails to ~2,000),
through the same `python -m jobs.train` (method: dpo / orpo); bench_job_unsloth.py --method runs
TRL's DPOTrainer / ORPOTrainer on the same pairs and pairs a step. `pair_tokens_per_s` counts
prompt + chosen + rejected once per pair (the same count for every stack); `real_tokens_per_s`
what each stack's forward saw (the prompt twice). `--method kto` (issue 38): the same pairs as
unpaired examples (kto.jsonl, pref_data.kto_rows), `--pairs` examples a step; `pair_tokens_per_s`
counts an example's prompt + completion once, its forward also sees the KL sequence (kto_stats).

    python bench/bench_job.py prepare --method dpo --shape llama-3.2-1b --dir /tmp/bj
    python bench/bench_job.py run --method dpo --stack fusetune --shape llama-3.2-1b --dir /tmp/bj --pairs 8
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_lora import SHAPES, _version  # noqa: E402
from bench.job_data import build_model, token_stats, write_dataset  # noqa: E402
from bench.pref_data import unit_files, write_preference_data  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MAX_LEN = 4096


class UtilSampler:
    """NVML GPU utilisation of the first visible GPU at `hz`, with timestamps, on a background thread.

    NVML numbers GPUs physically: under CUDA_VISIBLE_DEVICES=1 the job's GPU is NVML's 1, not 0."""

    def __init__(self, hz: float = 10.0):
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            index = int(first) if first.isdigit() else 0
            self._handle, self._nvml = pynvml.nvmlDeviceGetHandleByIndex(index), pynvml
        except Exception:  # no driver: no samples (CPU smoke runs)
            self._nvml = None
        self._thread = threading.Thread(target=self._run, args=(1.0 / hz,), daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        while self._nvml is not None and not self._stop.wait(period):
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            self.samples.append((time.time(), float(util)))

    def mean(self, start: float, end: float) -> float | None:
        window = [u for t, u in self.samples if start <= t <= end]
        return round(sum(window) / len(window), 1) if window else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def window_stats(steps: list[dict], warmup: int) -> dict:
    """Throughput over the steps after `warmup` from step records {time, tokens, loss, peak_gib} and,
    where the job wrote it, step_s: our step events are written one step late (the loop reads a
    step's numbers while the next one runs), so the last interval between their time stamps is only
    the last step's tail, which overstated host-bound rows by up to one step in the window (rows
    before 2026-12-02T06 were measured that way). The peers' stamps come from a step-end callback."""
    if len(steps) <= warmup + 1:
        warmup = 0
    window = steps[warmup + 1:]
    start, end = steps[warmup]["time"], steps[-1]["time"]
    tokens = sum(s["tokens"] for s in window)
    times = [b["time"] - a["time"] for a, b in zip(steps[warmup:], steps[warmup + 1:])]
    wall = round(tokens / max(end - start, 1e-9), 1)   # event stamps (ours a step late), the cross-check
    if all(s.get("step_s") for s in window):
        times = [s["step_s"] for s in window]
        end = start + sum(times)
    return {"real_tokens_per_s": round(tokens / max(end - start, 1e-9), 1), "wall_real_tokens_per_s": wall,
            "clocks_agree": round(wall / max(tokens / max(end - start, 1e-9), 1e-9), 3), "window_start": start,
            "window_end": end, "measured_steps": len(window), "tokens_per_step_mean": round(tokens / len(window)),
            "step_s_median": round(sorted(times)[len(times) // 2], 4), "final_loss": steps[-1]["loss"],
            "peak_gib": max((s.get("peak_gib") or 0) for s in steps) or None}


def pair_rows(pairs: int, stats: dict, max_len: int) -> tuple[int, int]:
    """(packed rows a step, max_seq_length) so that a step holds --pairs pairs on average, as the padded
    peers' --pairs a step do. A packed row is 2 x max_seq_length (jobs/data/pairs.py) and ~97% full; with
    rows of 2 x --max-len alone 8 pairs of these sets took one row of ~6.2 pairs. max_seq_length grows
    only past --max-len (every side of bench/pref_data.py's pairs is under it, so nothing is cut
    differently from the peers' max_length). Packed rows hold each pair's prompt once since 2026-12-05
    (jobs/data/pairs.py), so a pair takes `mean_forward_shared` tokens of a row (pair_rates records
    whether the job did: `prompt_once`)."""
    tokens = pairs * stats.get("mean_forward_shared", stats["mean_forward"]) / 0.97
    rows = max(1, int(tokens // (2 * max_len)))
    return rows, max(max_len, math.ceil(tokens / (2 * rows)))


def preference_config(stack: str, args, common: dict) -> dict:
    """--method dpo|orpo|kto: about --pairs pairs (KTO: examples) a step for every stack. Packed (a): rows of
    2 x max_len that hold as many tokens as --pairs pairs do on average (as (b) of SFT matches
    packed rows), so tokens per step match; padded (b): --pairs pairs."""
    rows_path, stats_path = unit_files(args.dir, args.method)
    common = {**common, "method": args.method, "dataset": str(rows_path), "dataset_format": "auto"}
    if stack == "fusetune":
        stats = json.loads(stats_path.read_text())
        rows, row_len = pair_rows(args.pairs, stats, args.max_len)
        return {**common, "fused_kernels": True, "packing": "auto" if args.device == "cuda" else "on",
                "batch_size": rows, "max_seq_length": row_len, "gradient_checkpointing": args.checkpointing,
                "base_precision": args.base_precision, "max_gpu_memory_gb": args.max_gpu_memory_gb,
                "load_in_4bit": args.load_in_4bit}
    micro = min(args.micro_batch, args.pairs)
    return {**common, "fused_kernels": False, "packing": "off", "batch_size": micro,
            "gradient_accumulation_steps": max(1, args.pairs // micro), "gradient_checkpointing": "on"}


def job_config(stack: str, args, model_dir: Path, data: Path, out: Path) -> dict:
    common = dict(model=str(model_dir), dataset=str(data), dataset_format="messages", output_dir=str(out),
                  lora_r=16, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, learning_rate=1e-4,
                  warmup_steps=0, max_steps=args.steps, save_steps=0, max_seq_length=args.max_len, seed=0,
                  dtype="bf16" if args.device == "cuda" else "fp32")
    if args.method != "sft":
        return preference_config(stack, args, common)
    if stack == "fusetune":
        return {**common, "fused_kernels": True, "packing": "auto" if args.device == "cuda" else "on",
                "batch_size": args.rows, "gradient_checkpointing": args.checkpointing,
                "base_precision": args.base_precision, "max_gpu_memory_gb": args.max_gpu_memory_gb,
                "load_in_4bit": args.load_in_4bit}
    stats = json.loads((args.dir / "dataset_stats.json").read_text())
    per_step = max(1, round(args.rows * args.max_len * 0.97 / stats["mean"]))   # packed rows are ~97% full
    micro = min(args.micro_batch, per_step)
    return {**common, "fused_kernels": False, "packing": "off", "batch_size": micro,
            "gradient_accumulation_steps": max(1, round(per_step / micro)), "gradient_checkpointing": "on"}


def run_job(stack: str, args) -> dict:
    import yaml
    model_dir, data = args.dir / args.shape, args.dir / "data.jsonl"
    name = (f"{args.shape}-{stack}-{args.checkpointing}-{args.base_precision}" if stack == "fusetune"
            else f"{args.shape}-{stack}") + (f"-{args.switch}" if args.switch else "") + (
        f"-budget{args.max_gpu_memory_gb:g}" if stack == "fusetune" and args.max_gpu_memory_gb else "") + (
        "-qlora" if stack == "fusetune" and args.load_in_4bit else "") + (
        f"-{args.method}" if args.method != "sft" else "")
    out = args.dir / f"job-{name}"
    shutil.rmtree(out, ignore_errors=True)   # events.jsonl appends: a rerun must not read the last run's steps
    config = job_config(stack, args, model_dir, data, out)
    path = args.dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    sampler = UtilSampler()
    began = time.time()
    try:
        proc = subprocess.run(job_command(path, args.switch), cwd=ROOT, capture_output=True,
                              text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as exc:   # the job is killed; what it logged still counts
        proc = subprocess.CompletedProcess(exc.cmd, -9, _text(exc.stdout), _text(exc.stderr) + "\n(timed out)")
    sampler.stop()
    log = out / "events.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
    steps = [{"time": e["time"], "tokens": e["tokens"], "loss": e["loss"], "peak_gib": e.get("peak_gb"),
              "step_s": e.get("step_s")}
             for e in events if e["type"] == "step"]
    result = {"stack": "fusetune (a)" if stack == "fusetune" else "pytorch (b)", "returncode": proc.returncode,
              "wall_s": round(time.time() - began, 1), "config": config,
              # kernels/ops/varlen_attention.py "Dispatch": the A/B of how attention reaches its kernel
              "varlen_via": os.environ.get("FUSETUNE_VARLEN_VIA") or "direct"}
    if proc.returncode or not steps:
        result["error"] = (proc.stderr or proc.stdout)[-1500:]
        return result
    start = next(e for e in events if e["type"] == "start")
    result.update(window_stats(steps, args.warmup), packing=start.get("packing"),
                  memory_estimate=start.get("memory_estimate"), patch_report=start.get("patch_report"))
    result["gpu_util_mean"] = sampler.mean(result["window_start"], result["window_end"])
    if args.method != "sft":
        result.update(pair_rates(args, result, events, proc.stdout.splitlines()))
        # PreferenceMethod.unit_terms: the reference pass first since 2026-12-04 (switch policyfirst: after)
        result["pass_order"] = "policy_first" if args.switch == "policyfirst" else "reference_first"
    result["losses"] = [step["loss"] for step in steps]   # step by step: graph vs eager runs compare exactly
    # the caching allocator's cudaMalloc calls and flush-and-retries after each step (jobs/train/loop.py)
    for key in ("cuda_mallocs", "alloc_retries"):
        result[key] = [e.get(key) for e in events if e["type"] == "step"]
    result["cuda_graph_env"] = os.environ.get("FUSETUNE_CUDA_GRAPH", "auto")
    result["switch"] = args.switch
    log = proc.stdout.splitlines()
    from jobs.train.graph_steps import CAPTURED_LINE
    result["cuda_graph"] = "on" if any(CAPTURED_LINE in line for line in log) else "off"
    result["log_head"] = [line for line in log if "packing" in line or "checkpointing" in line or "cuda graph" in line
                          or "packed" in line or "memory estimate" in line][:10]
    return result


def pair_rates(args, result: dict, events: list[dict], log: list[str]) -> dict:
    """Pair tokens (prompt + chosen + rejected; KTO: prompt + completion of an example) per second: the
    real tokens/s x mean / mean_forward (the same conversion for every stack; packed rows hold a varying
    number of pairs), and the reward metrics of the last step."""
    stats = json.loads(unit_files(args.dir, args.method)[1].read_text())
    last = [e for e in events if e["type"] == "step"][-1]
    # a job whose passes hold each prompt once ran fewer real tokens a pair (jobs/data/pairs.py; padded
    # rows off the GPU only where that pays, so there this is an approximation)
    shared = any(f"prompts: once per {unit}" in line for line in log for unit in ("pair", "example"))
    forward = stats.get("mean_forward_shared", stats["mean"]) if shared else stats["mean_forward"]
    per_step = result["tokens_per_step_mean"] / forward
    return {"pairs_per_step": round(per_step, 2), "prompt_once": shared,
            "pair_tokens_per_s": round(result["real_tokens_per_s"] * stats["mean"] / forward, 1),
            "first_loss": next(e["loss"] for e in events if e["type"] == "step"),
            "rewards": {k: last.get(k) for k in ("chosen_reward", "rejected_reward", "reward_margin",
                                                 "reward_accuracy") + (("kto_kl",) if args.method == "kto" else ())}}


def job_command(config: Path, switch: str | None) -> list[str]:
    """`python -m jobs.train CONFIG`; with a switch (bench_fp8.SWITCHES, e.g. fullx, or several joined
    by "+": fulldown+allrows) the same job with those engine constants set first, so an engine default
    is measured on the product path."""
    if not switch:
        return [sys.executable, "-m", "jobs.train", str(config)]
    from bench.bench_fp8 import SWITCHES
    sets = "".join(f"setattr(importlib.import_module({module!r}), {attr!r}, {value!r}); "
                   for module, attr, value in (SWITCHES[name] for name in switch.split("+")))
    code = f"import importlib, sys; {sets}from jobs.train.cli import main; sys.exit(main([{str(config)!r}]))"
    return [sys.executable, "-c", code]


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def versions() -> dict:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": _version("triton"), "transformers": _version("transformers"),
            "peft": _version("peft"), "trl": _version("trl"), "unsloth": _version("unsloth"),
            "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def prepare(args) -> None:
    from transformers import AutoTokenizer
    args.dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.method != "sft":   # the pairs and, from them, KTO's examples: every preference row after one prepare
        write_preference_data(args.dir, tokenizer, args.examples, seed=0)
    data = write_dataset(args.dir / "data.jsonl", args.examples, seed=0)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    stats = token_stats(tokenizer, rows)
    (args.dir / "dataset_stats.json").write_text(json.dumps(stats))
    print(json.dumps({"dataset": stats}), flush=True)
    shape = SHAPES[args.shape] if args.shape in SHAPES else json.loads(args.shape_json)
    build_model(shape, Path(args.tokenizer), args.dir / args.shape, device=args.device)


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as fh:
        fh.write(json.dumps(result) + "\n")
    keys = ("shape", "stack", "method", "pair_tokens_per_s", "real_tokens_per_s", "gpu_util_mean", "peak_gib", "final_loss", "step_s_median",
            "tokens_per_step_mean", "packing", "returncode", "error")
    print(json.dumps({k: result[k] for k in keys if k in result})[:1500], flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["prepare", "run", "smoke"])
    parser.add_argument("--shape", default="llama-3.2-1b")
    parser.add_argument("--shape-json", default=None, help="a shape dict for shapes not in bench_lora")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench_job"))
    parser.add_argument("--tokenizer", default=str(ROOT / ".carry" / "tok"))
    parser.add_argument("--stack", choices=["fusetune", "torch"], default="fusetune")
    parser.add_argument("--rows", type=int, default=4, help="packed rows of --max-len tokens a step")
    parser.add_argument("--micro-batch", type=int, default=4, help="(b): examples a micro-batch")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-len", type=int, default=MAX_LEN)
    parser.add_argument("--examples", type=int, default=3000)
    parser.add_argument("--checkpointing", default="auto")
    parser.add_argument("--max-gpu-memory-gb", type=float, default=0.0,
                        help="(a): the JobSpec key max_gpu_memory_gb: auto checkpointing plans within it (0: none)")
    parser.add_argument("--load-in-4bit", action="store_true", help="(a): QLoRA (the JobSpec key load_in_4bit)")
    parser.add_argument("--base-precision", default="bf16", choices=["bf16", "fp8"], help="(a): the JobSpec key")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--method", default="sft", choices=["sft", "dpo", "orpo", "kto"],
                        help="preference: --pairs a step")
    parser.add_argument("--pairs", type=int, default=8, help="--method dpo|orpo: pairs a step; kto: examples a step")
    parser.add_argument("--switch", default=None, help="(a): an engine switch from bench_fp8.SWITCHES, e.g. fullx")
    parser.add_argument("--timeout", type=int, default=int(os.environ.get("BENCH_STEP_LIMIT", 500)) - 20,
                        help="seconds for the job (device.sh sets BENCH_STEP_LIMIT to its step's limit)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "job.jsonl")
    args = parser.parse_args(argv)
    if args.what == "smoke":
        return smoke(args)
    if args.what == "prepare":
        return prepare(args)
    result = {**versions(), "shape": args.shape, "method": args.method, "rows": args.rows, "max_len": args.max_len, "steps": args.steps,
              "warmup": args.warmup, "dataset": json.loads((args.dir / "dataset_stats.json").read_text()),
              **({"pair_dataset": json.loads(unit_files(args.dir, args.method)[1].read_text())} if args.method != "sft"
                 else {}), **run_job(args.stack, args)}
    write(result, args.out)


def smoke(args) -> None:
    """CPU: prepare a tiny model and run (a) and (b) for a few steps through the same code."""
    tiny = json.dumps(dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=49152,
                           tie_word_embeddings=True, max_position_embeddings=4096))
    base = ["--dir", str(args.dir), "--device", "cpu", "--tokenizer", args.tokenizer, "--shape", "tiny",
            "--shape-json", tiny]
    sft = args.method == "sft"   # preference smoke runs are shorter: two sequences a unit
    base += ["--method", args.method]
    main(["prepare", *base, "--examples", "60" if sft else "16"])
    for stack in ("fusetune", "torch"):
        main(["run", *base, "--stack", stack, "--rows", "1", "--steps", "4" if sft else "3", "--warmup", "1",
              "--pairs", "2", "--max-len", "512" if sft else "192", "--micro-batch", "2", "--out", str(args.out)])


if __name__ == "__main__":
    main()
