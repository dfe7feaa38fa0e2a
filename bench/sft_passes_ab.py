"""SFT within a budget, whole micro-batch against a row a pass (issue 38; jobs/models/fit_passes.py).

The same model and rows both ways: 4 packed rows of 4,096 tokens a step within `--budget` GiB, either
in one forward + backward with the plan of the whole micro-batch (SFT_PASS_SECONDS high: passes only
to fit), or in passes with the plan of a pass (SFT_PASS_SECONDS 0.003: the bench switch sftpasses).
Each variant builds the model afresh, patches it (kernels.patch_model), applies the fit check's plan
(kernels.apply_checkpointing), and times eager steps (every pass's forward and backward, then AdamW)
by wall clock between device syncs; peak = max_memory_allocated. A quick look for direction, not a
protocol row (no peer, few steps): `bench/device.sh sft40 ... AB_SWITCH=sftpasses` is the row.

    python bench/sft_passes_ab.py --out /tmp/out/sft_passes_ab.jsonl      # on the GPU
    python bench/sft_passes_ab.py --shape tiny --device cpu --steps 2       # CPU smoke
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_lora import SHAPES, TARGETS, add_lora  # noqa: E402
from jobs.models import fit, fit_passes  # noqa: E402
from jobs.spec import JobSpec  # noqa: E402

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)


def config_of(shape: str):
    from transformers import AutoConfig
    values = dict(TINY if shape == "tiny" else SHAPES[shape])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def plan_of(config, rows: int, seq: int, budget: float, pass_seconds: float) -> tuple[int, tuple]:
    """(rows a pass, the checkpointing plan of a pass) as the job would choose them."""
    fit_passes.SFT_PASS_SECONDS = pass_seconds
    spec = JobSpec(model="x", dataset="y", method="sft", batch_size=rows, max_seq_length=seq,
                   max_gpu_memory_gb=budget, gradient_checkpointing="auto", fused_kernels=True, lora_r=16,
                   lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, dtype="bf16")
    return fit.pass_units(spec, config), fit.plan_within_budget(spec, config)


def run_variant(args, name: str, pass_seconds: float) -> dict:
    from transformers import AutoModelForCausalLM

    from kernels import apply_checkpointing, patch_model
    from kernels.packed_attention import use_packed_attention
    config = config_of(args.shape)
    part, plan = plan_of(config, args.rows, args.seq, args.budget, pass_seconds)
    device = torch.device(args.device)
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    model = add_lora(model)
    report = patch_model(model, backend="auto")
    policy = apply_checkpointing(model, "auto", batch_tokens=part * args.seq, plan=plan[:3] if plan else None)
    use_packed_attention(model)
    cu = torch.arange(0, (part + 1) * args.seq, args.seq, dtype=torch.int32, device=device)
    docs = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": args.seq, "max_length_k": args.seq}
    gen = torch.Generator(device=device).manual_seed(1234)
    step_rows = torch.randint(0, config.vocab_size, (args.rows, args.seq), device=device, generator=gen)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    count = torch.tensor(float(args.rows * (args.seq - 1)), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(args.warmup + args.steps):
        sync()
        tick, total = time.perf_counter(), 0.0
        for start in range(0, args.rows, part):
            x = step_rows[start:start + part]
            loss = model(input_ids=x, labels=x, num_items_in_batch=count, **docs).loss
            loss.backward()
            total += loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - tick)
        losses.append(float(total))
    steady = times[args.warmup:]
    mean = sum(steady) / len(steady)
    result = {"variant": name, "shape": args.shape, "rows": args.rows, "seq": args.seq, "budget_gib": args.budget,
              "pass_rows": part, "plan": policy, "step_s": round(mean, 4), "steps": len(steady),
              "tokens_per_s": round(args.rows * args.seq / mean), "step_s_all": [round(t, 4) for t in times],
              "first_loss": losses[0], "last_loss": losses[-1], "fused": report.lines()[:1],
              "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 3) if device.type == "cuda" else None}
    del model, opt, report
    gc.collect()   # the patched model sits in reference cycles (hooks): free it before the next variant's peak
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama-3.2-1b")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--budget", type=float, default=5.37)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--variants", default="whole,passes,whole", help="whole twice: drift; one alone: its peak")
    args = parser.parse_args()
    for name in args.variants.split(","):
        result = run_variant(args, name, {"whole": 10.0, "passes": 0.003}[name])
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
