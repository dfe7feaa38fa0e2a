"""Unsloth (bf16) in bench_lora.py's config, on a model folder written by bench_fp8.py --save-model, so
that Unsloth and our engine train the very same weights on the very same data in one device call.

Unsloth patches transformers when imported, so it runs in its own process (this script), imported
before transformers. BASELINES.md's Unsloth setup: FastLanguageModel, LoRA r=16 alpha=16 dropout 0
on q,k,v,o,gate,up,down, use_gradient_checkpointing "unsloth" (GC on) or False; AdamW lr 1e-4 on
the LoRA parameters; random token ids with labels = inputs; median of 8 steps after 3 warm-ups;
peak = max_memory_allocated. Writes one bench_lora.py-style JSON line with stack "unsloth".

    python bench/unsloth_rows.py --model-dir /tmp/m8b --shape llama-3.1-8b --bs 2 --gc unsloth
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import unsloth  # noqa: F401  (must come before transformers)
import torch
from unsloth import FastLanguageModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_lora import SHAPES, TARGETS, _version, make_batches, timed_steps  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--bs", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--gc", choices=["unsloth", "off"], default="unsloth")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model, _ = FastLanguageModel.from_pretrained(model_name=args.model_dir, max_seq_length=args.seq,
                                                 dtype=torch.bfloat16, load_in_4bit=False)
    gc = "unsloth" if args.gc == "unsloth" else False
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0, target_modules=TARGETS,
                                             bias="none", random_state=0, use_gradient_checkpointing=gc)
    FastLanguageModel.for_training(model, use_gradient_checkpointing=gc)   # training mode, same checkpointing
    batches = make_batches(args.shape, args.bs, args.seq)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    timed = timed_steps(model, batches, opt, args.warmup, args.steps)
    median = statistics.median(timed["step_s_all"][args.warmup:])
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": _version("triton"),
              "transformers": _version("transformers"), "unsloth": _version("unsloth"),
              "python": platform.python_version(), "shape": args.shape, "stack": "unsloth", "bs": args.bs,
              "seq": args.seq, "checkpointing": "unsloth" if args.gc == "unsloth" else "off", "lora_r": 16,
              "tokens_per_s": round(args.bs * args.seq / median, 1), "step_s_median": round(median, 4),
              **timed,
              "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
              "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with open(args.out, "a") as fh:
        fh.write(json.dumps(result) + "\n")
    print(json.dumps({k: result[k] for k in ("shape", "stack", "checkpointing", "tokens_per_s", "step_s_median",
                                             "peak_gib", "first_step_loss")}), flush=True)


if __name__ == "__main__":
    main()
