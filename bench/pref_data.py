"""Preference pairs for bench/bench_job.py --method dpo|orpo (and bench_job_unsloth.py).

Lengths as issue 19 states the real-job benchmark: a prompt of median ~80 tokens and answers of
median ~180 tokens a side, log-normal (sigma 0.8: p90 ~ 2.8x the median) with a 2 % tail of
long answers up to ~2,000 tokens. Text is made of space-separated single letters (" a b c"), one
token each with a BPE tokenizer (SmolLM2's: "Ġa"), so a length in tokens is a length in
letters. The chosen and rejected answers of a pair have independent lengths and letters.

Rows are TRL's conversational explicit-prompt form, which Fusetune reads as is:
{"prompt": [{"role": "user", ...}], "chosen": [{"role": "assistant", ...}], "rejected": [...]}.
"""
from __future__ import annotations

import math
import random
from pathlib import Path

from bench.job_data import write_jsonl

LETTERS = "abcdefghijklmnopqrstuvwxyz"
PROMPT_MEDIAN, ANSWER_MEDIAN, SIGMA = 80, 180, 0.8
TAIL_SHARE, TAIL_RANGE, LONGEST = 0.02, (1200, 2000), 2000


def _length(rng: random.Random, median: int, tail: bool) -> int:
    if tail and rng.random() < TAIL_SHARE:
        return rng.randint(*TAIL_RANGE)
    return min(LONGEST, max(4, int(rng.lognormvariate(math.log(median), SIGMA))))


def _letters(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(LETTERS) for _ in range(n))


def pair_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt = _letters(rng, _length(rng, PROMPT_MEDIAN, tail=False))
        chosen = _letters(rng, _length(rng, ANSWER_MEDIAN, tail=True))
        rejected = _letters(rng, _length(rng, ANSWER_MEDIAN, tail=True))
        rows.append({"prompt": [{"role": "user", "content": prompt}],
                     "chosen": [{"role": "assistant", "content": chosen}],
                     "rejected": [{"role": "assistant", "content": rejected}]})
    return rows


def write_pairs(path: Path, n: int, seed: int = 0) -> Path:
    return write_jsonl(path, pair_rows(n, seed))


def pair_stats(tokenizer, rows: list[dict]) -> dict:
    """Token percentiles of prompt and answers; `mean`: tokens of a pair (prompt + chosen +
    rejected, the template's tokens included), what pair_tokens_per_s counts; `mean_forward`: the
    same with the prompt twice (each side runs after it), what a forward sees."""
    def count(messages, generation=False):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompts = [count(r["prompt"], True) for r in rows]
    chosen = [count(r["prompt"] + r["chosen"]) - p for r, p in zip(rows, prompts)]
    rejected = [count(r["prompt"] + r["rejected"]) - p for r, p in zip(rows, prompts)]

    def pct(values, p):
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    sides = {name: {"p50": pct(v, 0.5), "p90": pct(v, 0.9), "p99": pct(v, 0.99), "max": max(v)}
             for name, v in (("prompt", prompts), ("chosen", chosen), ("rejected", rejected))}
    pair = [p + c + r for p, c, r in zip(prompts, chosen, rejected)]
    forward = [2 * p + c + r for p, c, r in zip(prompts, chosen, rejected)]   # what a forward sees
    return {"pairs": len(rows), "mean": round(sum(pair) / len(pair), 1),
            "mean_forward": round(sum(forward) / len(forward), 1), "longest_side": max(
        p + max(c, r) for p, c, r in zip(prompts, chosen, rejected)), **sides}
