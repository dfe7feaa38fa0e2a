"""A/B rows in one process: build and patch the model once, then time each engine variant on it.

A variant flips module-level switches of the engine (read at call time, so no re-patching):
    default            the engine as committed
    lora_add=addmm     LoRA forward adds through cuBLAS addmm_ instead of kernels/ops/lora_add.py
    lora_act_bwd=on    down adapter's dh term inside the activation-backward kernel (off by default)
    old                the engine before kernels/ops/lora_add.py (= lora_add=addmm)
Each run appends one bench_lora.py JSON line with a "variant" field. Same step/peak method as
bench_lora.py (median of 8 steps after 3 warm-ups; peak reset before each variant).

    python bench/ab_rows.py --shape llama-3.1-8b --bs 2 --checkpointing offload --variants default,old
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_lora import ROOT, SHAPES, _write, add_lora, build_model, run  # noqa: E402

SWITCHES = {
    "lora_add=addmm": [("kernels.ops.lora_add", "BACKEND", "addmm")],
    "lora_act_bwd=on": [("kernels.ops.lora_mlp", "FUSE_DOWN_LORA_BACKWARD", True)],
}
SWITCHES["old"] = SWITCHES["lora_add=addmm"]
SWITCHES["default"] = []


def run_variant(args, model, variant: str) -> dict:
    if variant not in SWITCHES:
        raise SystemExit(f"unknown variant {variant!r}; choose from {sorted(SWITCHES)}")
    saved = []
    for module_name, attr, value in SWITCHES[variant]:
        module = importlib.import_module(module_name)
        saved.append((module, attr, getattr(module, attr)))
        setattr(module, attr, value)
    try:
        result = run(args, model)
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)
    result["variant"] = variant
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--bs", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--checkpointing", choices=["on", "off", "auto", "offload"], default="on")
    parser.add_argument("--qlora", action="store_true")
    parser.add_argument("--variants", default="default,old")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora.jsonl"))
    args = parser.parse_args()
    args.stack, args.lora_dtype, args.fused_adamw = "fusetune", "fp32", False
    model = add_lora(build_model(args.shape, args.qlora), args.lora_dtype)
    for variant in args.variants.split(","):
        _write(args.out, run_variant(args, model, variant))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
