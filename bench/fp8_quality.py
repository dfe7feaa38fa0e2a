"""Does FP8 base-weight training learn as well as bf16? The same LoRA fine-tune run twice (bf16
bases, then FP8 bases), same model, data, order and seed; train and eval loss curves to --out.

The task (the device has no model hub, so the base model is random-init; the data is generated
with a structure a LoRA can learn, and written as JSON lines of token ids with --dump-data):
  * a "language" of 2,048 token ids drawn from the full vocabulary (seeded);
  * each token has 4 possible successors with probabilities 0.55 / 0.25 / 0.15 / 0.05 (a sparse
    Markov chain: 1.15 nats/token of irreducible entropy), so the model must learn which 2,048 of
    128,256 tokens occur (ln 128256 = 11.76 -> ln 2048 = 7.62) and then the bigram table;
  * every sequence is 256 Markov tokens followed by the same 256 again: the second half is
    predictable from the first by copying (what induction heads learn).
Training: Llama-3.2-1B shape (bench_lora.py SHAPES), LoRA r16 alpha 16 on q,k,v,o,gate,up,down,
fp32 adapters, AdamW lr 5e-4, 10 warm-up steps then cosine to 0, grad-norm clip 1.0, 8 x 512
tokens a step, 200 steps, our fused engine (no recompute); eval loss on 32 held-out sequences
every 25 steps. The issue's criteria: eval loss after 200 steps with FP8 within 1 % of bf16,
first-step loss within 1e-2 relative; the summary line says whether both held.

    python bench/fp8_quality.py --out bench/results/fp8_quality.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_lora import SHAPES, add_lora  # noqa: E402

SUCCESSOR_PROBS = (0.55, 0.25, 0.15, 0.05)


def make_language(vocab: int, n_tokens: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randperm(vocab, generator=gen)[:n_tokens]
    successors = torch.randint(0, n_tokens, (n_tokens, len(SUCCESSOR_PROBS)), generator=gen)
    return tokens, successors


def sample(language, count: int, half: int, seed: int) -> torch.Tensor:
    """[count, 2 * half] token ids: a Markov walk of `half` tokens, then the same walk again."""
    tokens, successors = language
    gen = torch.Generator().manual_seed(seed)
    probs = torch.tensor(SUCCESSOR_PROBS)
    state = torch.randint(0, len(tokens), (count,), generator=gen)
    walk = [state]
    for _ in range(half - 1):
        pick = torch.multinomial(probs, count, replacement=True, generator=gen)
        state = successors[state, pick]
        walk.append(state)
    ids = tokens[torch.stack(walk, dim=1)]
    return torch.cat([ids, ids], dim=1)


def build(shape_cfg: dict, dev: str):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = dict(shape_cfg)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
    model.config.use_cache = False
    return add_lora(model)


def evaluate(model, data, bs: int) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(data), bs):
            x = data[i:i + bs]
            total += float(model(input_ids=x, labels=x).loss) * len(x)
            count += len(x)
    return total / count


def train(variant: str, args, shape_cfg, train_data, eval_data, out) -> list[dict]:
    """One run; variant is bf16, fp8 or fp8+SWITCH (bench/bench_fp8.py SWITCHES, e.g. fp8+savex)."""
    import importlib
    from bench.bench_fp8 import SWITCHES
    precision, *switches = variant.split("+")
    saved = []
    for name in switches:
        module_name, attr, value = SWITCHES[name]
        module = importlib.import_module(module_name)
        saved.append((module, attr, getattr(module, attr)))
        setattr(module, attr, value)
    try:
        return _train(variant, precision, args, shape_cfg, train_data, eval_data, out)
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)


def _train(variant, precision, args, shape_cfg, train_data, eval_data, out) -> list[dict]:
    from kernels import apply_checkpointing, patch_model
    dev = train_data.device.type
    model = build(shape_cfg, dev)
    report = patch_model(model, backend="triton", base_precision=precision)
    apply_checkpointing(model, "off")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    warmup = min(10, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / (warmup + 1) if s < warmup else
                                              0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, args.steps - warmup))))
    rows, tick = [], time.perf_counter()
    for step in range(args.steps + 1):
        row = {"precision": variant, "step": step}
        if step % args.eval_every == 0 or step == args.steps:
            row["eval_loss"] = evaluate(model, eval_data, args.bs)
        if step < args.steps:
            x = train_data[(step * args.bs) % len(train_data):][:args.bs]
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            row["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            row["loss"] = float(loss)
        row["elapsed_s"] = round(time.perf_counter() - tick, 2)
        rows.append(row)
        out.write(json.dumps(row) + "\n")
        if "eval_loss" in row:
            print(json.dumps(row), flush=True)
    fp8_lines = [line for line in report.lines() if "fp8" in line]
    print(f"{variant}: {len(fp8_lines)} fp8 report lines; first: {fp8_lines[:2]}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--bs", type=int, default=8)
    parser.add_argument("--half", type=int, default=256, help="Markov tokens before the repeat")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-seqs", type=int, default=32)
    parser.add_argument("--variants", default="bf16,fp8,fp8+fullx", help="bf16 first, then what to compare with it")
    parser.add_argument("--dump-data", default=None, help="also write the train/eval token ids as JSON lines here")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU (TRITON_INTERPRET=1), a few steps")
    parser.add_argument("--out", default="fp8_quality.jsonl")
    args = parser.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    shape_cfg = dict(SHAPES[args.shape])
    if args.smoke:
        shape_cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1024)
        args.steps, args.half, args.bs, args.eval_every, args.eval_seqs = 2, 8, 2, 2, 2
    language = make_language(shape_cfg["vocab_size"], min(2048, shape_cfg["vocab_size"] // 2), seed=11)
    train_data = sample(language, args.steps * args.bs, args.half, seed=12).to(dev)
    eval_data = sample(language, args.eval_seqs, args.half, seed=13).to(dev)
    if args.dump_data:
        with open(args.dump_data, "w") as fh:
            for split, data in (("train", train_data), ("eval", eval_data)):
                for ids in data.tolist():
                    fh.write(json.dumps({"split": split, "input_ids": ids}) + "\n")
    variants = args.variants.split(",")
    if variants[0] != "bf16":
        raise SystemExit("--variants must start with bf16 (the baseline the others are compared with)")
    with open(args.out, "a", buffering=1) as out:   # line-buffered: a timeout keeps the curves so far
        curves = {v: train(v, args, shape_cfg, train_data, eval_data, out) for v in variants}
        first = {v: c[0]["loss"] for v, c in curves.items()}
        final = {v: c[-1]["eval_loss"] for v, c in curves.items()}
        summary = {"summary": True, "shape": args.shape, "steps": args.steps, "tokens_per_step": args.bs * 2 * args.half,
                   "first_step_loss": first, "final_eval_loss": final,
                   "first_step_rel_diff": {v: abs(first[v] - first["bf16"]) / first["bf16"] for v in variants[1:]},
                   "final_eval_rel_diff": {v: abs(final[v] - final["bf16"]) / final["bf16"] for v in variants[1:]},
                   "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
                   "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        summary["passes"] = {v: summary["first_step_rel_diff"][v] < 1e-2 and summary["final_eval_rel_diff"][v] < 1e-2
                             for v in variants[1:]}
        out.write(json.dumps(summary) + "\n")
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
