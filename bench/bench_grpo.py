"""GRPO, end to end, on the same prompts, lengths and LoRA config:
(a) `python -m jobs.train` with method grpo and the fused engine (sampling: jobs/train/decode.py's
    static-KV-cache loop, a CUDA-graph decode step; policy step: fused log-probs),
(b) Unsloth + TRL GRPOTrainer (bench/bench_grpo_unsloth.py, its own process; without vLLM: it is
    not on the device, so TRL samples with transformers' generate too; say so with the numbers),
(gen) generation alone: jobs/train/rollout.py's sampler on the job's (patched) model (through
    generate, our loop eager, our loop as a CUDA graph) against plain transformers `generate` of the
    same weights, tokens/s over the whole batch.

Random weights of a real shape (bench/job_data.py build_model; bench_lora.SHAPES), prompts from
builtin:arithmetic written to prompts.jsonl, `--prompts` prompts x `--generations` completions a
step, completions to `--completion-len` tokens, beta 0, LoRA r16 on every linear. Random weights
rarely sample EOS, so completions run to the limit in every stack alike. Optimizer steps/s over the
steps after --warmup and peak GiB; one JSON line a run in --out (bench/results/grpo.jsonl).

    python bench/bench_grpo.py prepare --shape llama-3.2-1b --dir /tmp/bg
    python bench/bench_grpo.py run --stack fusetune --shape llama-3.2-1b --dir /tmp/bg
    python bench/bench_grpo.py run --stack unsloth --shape llama-3.2-1b --dir /tmp/bg
    python bench/bench_grpo.py gen --shape llama-3.2-1b --dir /tmp/bg
    python bench/bench_grpo.py --smoke            # CPU: (a) and (gen) on a tiny model
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_job import TARGETS, versions, write  # noqa: E402


def prepare(args) -> None:
    from bench.bench_lora import SHAPES
    from bench.job_data import build_model
    from jobs.data.builtin.arithmetic import arithmetic_rows
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = arithmetic_rows(n=max(64, args.prompts * (args.steps + 1)), seed=0)
    (args.dir / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    shape = SHAPES[args.shape] if args.shape in SHAPES else json.loads(args.shape_json)
    build_model(shape, Path(args.tokenizer), args.dir / args.shape, device=args.device)


def job_config(args, out: Path) -> dict:
    return dict(model=str(args.dir / args.shape), method="grpo", dataset=str(args.dir / "prompts.jsonl"),
                output_dir=str(out), lora_r=16, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS,
                learning_rate=1e-5, warmup_steps=0, max_steps=args.steps, save_steps=0, seed=0,
                batch_size=args.prompts, num_generations=args.generations,
                max_completion_length=args.completion_len, max_seq_length=512, beta=0.0, rewards="answer, format",
                fused_kernels=args.device == "cuda", dtype="bf16" if args.device == "cuda" else "fp32",
                gradient_checkpointing="auto", max_gpu_memory_gb=args.max_gpu_memory_gb)


def step_stats(times: list[float], warmup: int, durations: list[float] | None = None) -> dict:
    """Optimizer steps per second over the steps after `warmup`: from each step's own duration where
    given (our step events' step_s), else from the time stamps of step ends (the peer's callback).
    Our events' time stamps are NOT step ends: the loop writes a step's event after queueing the
    next one (after that one's sampling), so their last interval is one policy step only. Rows of
    2026-12-01/02 before 06:00 were measured from those stamps and understate our step time."""
    if durations:
        window = durations[warmup:] if len(durations) > warmup else durations
        span = sum(window)
        return {"measured_steps": len(window), "steps_per_s": round(len(window) / span, 4) if span > 0 else None,
                "step_s_mean": round(span / len(window), 3), "step_s": [round(d, 3) for d in window]}
    if len(times) <= warmup + 1:
        warmup = 0
    window = times[warmup:]
    span = window[-1] - window[0]
    return {"measured_steps": len(window) - 1,
            "steps_per_s": round((len(window) - 1) / span, 4) if span > 0 else None,
            "step_s_mean": round(span / max(1, len(window) - 1), 3)}


def write_config(args) -> Path:
    import yaml
    path = args.dir / f"grpo-{args.shape}.yaml"
    path.write_text(yaml.safe_dump(job_config(args, args.dir / f"job-grpo-{args.shape}")))
    return path


def run_fusetune(args) -> dict:
    import yaml
    out = args.dir / f"job-grpo-{args.shape}"
    shutil.rmtree(out, ignore_errors=True)
    path = write_config(args)
    config = yaml.safe_load(path.read_text())
    began = time.time()
    proc, stopped = _run_within_limit([sys.executable, "-m", "jobs.train", str(path)], _limit(args))
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()] \
        if (out / "events.jsonl").is_file() else []
    steps = [e for e in events if e["type"] == "step"]
    result = {"stack": "fusetune (a)", "returncode": proc.returncode, "wall_s": round(time.time() - began, 1),
              "config": config}
    if stopped and steps:   # the steps written before the limit still make a row, as the peer's do
        result.update(partial=True, steps_done=len(steps), note=stopped)
    elif proc.returncode or not steps:
        result["error"] = (stopped or "") + (proc.stderr or proc.stdout)[-1500:]
        return result
    durations = [e["step_s"] for e in steps] if all(e.get("step_s") for e in steps) else None
    result.update(step_stats([e["time"] for e in steps], args.warmup, durations),
                  peak_gib=max((e.get("peak_gb") or 0) for e in steps) or None,
                  each_step_s=[e.get("step_s") for e in steps],
                  each_step_peak_gib=[e.get("peak_gb") for e in steps],
                  completion_length=[e.get("completion_length") for e in steps],
                  rollout_s=[e.get("rollout_s") for e in steps],
                  sampler="jobs/train/decode.py (static KV cache, CUDA-graph decode step)",
                  **log_lines(out / "train.log"))
    return result


def log_lines(log: Path) -> dict:
    """What the job's log says it planned: the fit check's estimate (to set beside the measured peak),
    the checkpointing plan, the prompts' packing, and the sampling and policy passes."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    keys = {"memory estimate:": "estimate", "checkpointing:": "plan", "grpo prompts:": "prompts",
            "grpo packing:": "packing", "grpo sampling:": "sampling", "grpo policy step:": "policy"}
    found = {}
    for line in text.splitlines():
        for marker, key in keys.items():
            if marker in line and key not in found:
                found[key] = line.split(marker, 1)[1].strip()[:400]
    return found


def _json_row(line: str) -> dict | None:
    """A stdout line that is one of the peer script's JSON rows, else None: TRL prints its logs as Python
    dicts ("{'loss': ...}"), which also start with "{" (2026-12-05: one of those after the last row lost
    a 390 s peer run)."""
    if not line.startswith("{"):
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _limit(args) -> int:
    """Seconds this run may take: --timeout, or less where device.sh's stage limit (BENCH_STEP_LIMIT) is
    shorter, with 15 s left to write the row before the stage's own `timeout` kills this process."""
    return max(1, min(args.timeout, int(os.environ.get("BENCH_STEP_LIMIT", args.timeout)) - 15))


def _run_within_limit(cmd: list[str], limit: int):
    """(the finished process with its output, "" or why it was stopped): a process still running at the
    limit is killed, so what it wrote so far (our job's step events) still makes a row (2026-12-06: a
    GRPO 8B run past a 271 s limit was killed from outside with its steps and left no row)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=limit)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err), ""
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err), f"stopped after {limit} s (the step limit)"


def run_unsloth(args) -> dict:
    """The peer in its own process. It prints a row after every optimizer step, so when a step is slower
    than the time left (2,048-token completions: minutes a step) the last complete row still comes back,
    marked partial, instead of nothing (2026-12-03: a 330 s limit killed a 2-step run with no row)."""
    cmd = [sys.executable, str(ROOT / "bench" / "bench_grpo_unsloth.py"), "--shape", args.shape, "--dir",
           str(args.dir), "--prompts", str(args.prompts), "--generations", str(args.generations),
           "--completion-len", str(args.completion_len), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    proc, stopped = _run_within_limit(cmd, _limit(args))
    out, err = proc.stdout, (stopped + "\n" + proc.stderr) if stopped else proc.stderr
    rows = [row for row in map(_json_row, out.splitlines()) if row is not None]
    if not rows:
        return {"stack": "unsloth+trl (b)", "returncode": proc.returncode, "error": (err or out)[-1500:]}
    row = rows[-1]
    if proc.returncode and not row.get("partial"):
        row["error"] = err[-1500:]
    return row


def generation(args) -> dict:
    """(gen): ours (the job's sampler on the engine-patched model) vs transformers generate."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from jobs.data.prompts import encode_prompts, load_prompt_rows
    from jobs.spec import JobSpec
    from jobs.train.rollout import generate_completions, sample_completions
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    source = args.dir / args.shape
    tokenizer = AutoTokenizer.from_pretrained(source)
    spec = JobSpec.from_dict({"method": "grpo", "dataset": str(args.dir / "prompts.jsonl")})
    prompts = [r.input_ids for r in encode_prompts(tokenizer, load_prompt_rows(spec), 512)[:args.prompts]]
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device)
    result = {"stack": "generation (gen)", "prompts": args.prompts, "generations": args.generations}
    # plain transformers first (patching is one-way), then the engine-patched model through generate
    # (the sampler before issue 20's decode loop) and through our loop, eager and as a CUDA graph
    runs = (("transformers_generate", False, generate_completions, {}),
            ("fusetune_generate", True, generate_completions, {}),
            ("fusetune_decode_eager", True, sample_completions, {"use_graph": False}),
            ("fusetune_decode", True, sample_completions, {"log": lambda line: result.setdefault("log", []).append(line)}))
    for name, patched, sampler, extra in runs:
        if patched and args.device == "cuda" and not getattr(model, "_bench_patched", False):
            from kernels import patch_model
            patch_model(model, backend="auto")
            model._bench_patched = True
        sampler(model, tokenizer, prompts[:1], 2, 8, 1.0, 1.0, device, **extra)   # warm-up
        if args.device == "cuda":
            torch.cuda.synchronize()
        began = time.time()
        completions = sampler(model, tokenizer, prompts, args.generations, args.completion_len, 1.0, 1.0, device,
                              **extra)
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.time() - began
        tokens = sum(len(c) for c in completions)
        result[name] = {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}
    base = result["transformers_generate"]["tokens_per_s"]
    result["speedup"] = round(result["fusetune_decode"]["tokens_per_s"] / base, 3)
    result["speedup_eager"] = round(result["fusetune_decode_eager"]["tokens_per_s"] / base, 3)
    result["note"] = ("speedup: jobs/train/decode.py's static-cache loop (one decode step replayed as a CUDA graph on "
                      "the GPU) on the patched model vs transformers generate on the plain one; no LoRA adapter here")
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=["prepare", "config", "run", "gen"], default="run")
    parser.add_argument("--smoke", action="store_true", help="CPU: prepare a tiny model, run (a) and (gen)")
    parser.add_argument("--shape", default="llama-3.2-1b")
    parser.add_argument("--shape-json", default=None)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench_grpo"))
    parser.add_argument("--tokenizer", default=str(ROOT / ".carry" / "tok"))
    parser.add_argument("--stack", choices=["fusetune", "unsloth"], default="fusetune")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--completion-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--timeout", type=int, default=560)
    parser.add_argument("--max-gpu-memory-gb", type=float, default=0.0,
                        help="ours: the JobSpec key max_gpu_memory_gb (set it to the peer's peak: issue 20)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "grpo.jsonl")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke(args)
    if args.what == "prepare":
        return prepare(args)
    if args.what == "config":   # the job's YAML only (for bench/profile_decode.py)
        return print(write_config(args))
    head = {**versions(), "shape": args.shape, "prompts": args.prompts, "generations": args.generations,
            "completion_len": args.completion_len, "steps": args.steps, "warmup": args.warmup}
    if args.what == "gen":
        return write({**head, **generation(args)}, args.out)
    write({**head, **(run_fusetune(args) if args.stack == "fusetune" else run_unsloth(args))}, args.out)


def smoke(args) -> None:
    from transformers import AutoTokenizer
    vocab = len(AutoTokenizer.from_pretrained(args.tokenizer))
    tiny = json.dumps(dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                           tie_word_embeddings=True, max_position_embeddings=1024))
    base = ["--dir", str(args.dir), "--device", "cpu", "--tokenizer", args.tokenizer, "--shape", "tiny",
            "--shape-json", tiny, "--prompts", "2", "--generations", "2", "--completion-len", "8",
            "--steps", "3", "--warmup", "1", "--out", str(args.out)]
    main(["prepare", *base])
    main(["run", *base])
    main(["gen", *base])


if __name__ == "__main__":
    main()
