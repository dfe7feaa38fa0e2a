"""(b) of bench/bench_grpo.py: Unsloth + TRL GRPOTrainer on the same model folder, prompts, group
size, completion length, LoRA config and step count; beta 0 (no reference model), no vLLM (not on
the device: TRL samples with transformers' generate). Its own process: Unsloth must be imported
before transformers/peft/trl. TRL 1.x counts per_device_train_batch_size in completions, so it is
prompts x generations here (one optimizer step = one generation round, as in (a)).

    python bench/bench_grpo_unsloth.py --shape llama-3.2-1b --dir /tmp/bg --prompts 8 --generations 8"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import unsloth  # noqa: F401  (first: it patches transformers, peft and trl on import)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_grpo import step_stats  # noqa: E402
from bench.bench_job import versions  # noqa: E402
from bench.bench_job_unsloth import train_timed, unsloth_lora  # noqa: E402
from jobs.train.rewards.builtin import answer, format as format_reward  # noqa: E402  (the same rewards)


def train(args) -> dict:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in (args.dir / "prompts.jsonl").read_text().splitlines() if line.strip()]
    data = Dataset.from_list(rows)
    model, tokenizer = unsloth_lora(args.dir / args.shape, max(1024, 512 + args.completion_len), fast_inference=False)
    config = GRPOConfig(output_dir=str(args.dir / f"unsloth-grpo-{args.shape}"), use_vllm=False, beta=0.0,
                        num_generations=args.generations, max_completion_length=args.completion_len,
                        per_device_train_batch_size=args.prompts * args.generations, gradient_accumulation_steps=1,
                        max_steps=args.steps, learning_rate=1e-5, warmup_steps=0, logging_steps=1,
                        save_strategy="no", report_to="none", bf16=True, seed=0, loss_type="dapo")
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[answer, format_reward],
                          args=config, train_dataset=data)
    config_row = {"per_device_train_batch_size": config.per_device_train_batch_size,
                  "num_generations": args.generations, "max_completion_length": args.completion_len,
                  "loss_type": "dapo", "gradient_checkpointing": "unsloth"}
    began = time.time()

    def report(ends: list[float], partial: bool) -> dict:
        # each step's own duration too: with one step done, the only number is step 1 (with its warm-up)
        marks = [began, *ends]
        row = {"stack": "unsloth+trl (b)", "wall_s": round(time.time() - began, 1), **step_stats(ends, args.warmup),
               "steps_done": len(ends), "each_step_s": [round(b - a, 3) for a, b in zip(marks, marks[1:])],
               "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 3), "vllm": False, "config": config_row}
        if partial:
            row["partial"] = True
            if len(ends) == 1:
                row["steps_per_s"] = round(1 / row["each_step_s"][0], 4)
                row["step_s_mean"] = row["each_step_s"][0]
                row["note"] = "one step done before the limit: its time includes the peer's warm-up"
        print(json.dumps({**args.head, **row}), flush=True)
        return row

    ends, began = train_timed(trainer, on_step=lambda ends: report(ends, partial=len(ends) < args.steps))
    return report(ends, partial=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.2-1b")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench_grpo"))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--completion-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    result = {**versions(), "shape": args.shape}
    args.head = dict(result)
    try:
        result.update(train(args))
    except Exception as exc:  # a result line all the same: bench_grpo.py writes it beside (a)
        result.update(stack="unsloth+trl (b)", error=f"{type(exc).__name__}: {exc}"[:1500])
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
