"""Preference pairs for bench/bench_job.py --method dpo|orpo (and bench_job_unsloth.py).

Lengths as issue 19 states the real-job benchmark: a prompt of median ~80 tokens and answers of
median ~180 tokens a side, log-normal (sigma 0.8: p90 ~ 2.8x the median) with a 2 % tail of
long answers up to ~2,000 tokens. Text is made of space-separated single letters (" a b c"), one
token each with a BPE tokenizer (SmolLM2's: "Ġa"), so a length in tokens is a length in
letters. The chosen and rejected answers of a pair have independent lengths and letters.

Rows are TRL's conversational explicit-prompt form, which Fusetune reads as is:
{"prompt": [{"role": "user", ...}], "chosen": [{"role": "assistant", ...}], "rejected": [...]}.
KTO (issue 38) trains on the same pairs unpaired (kto_rows): TRL's {"prompt", "completion", "label"} form,
which both Fusetune (method kto) and TRL's KTOTrainer read.
"""
from __future__ import annotations

import json
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


def kto_rows(rows: list[dict]) -> list[dict]:
    """Each pair as two unpaired examples, the chosen answer desirable (label True) and the rejected one
    undesirable (False): TRL's documented conversion (trl/data_utils.py `unpair_preference_dataset`).
    Interleaved pair by pair: TRL's batched map puts a block of chosen before a block of rejected, so
    KTOTrainer's sequential batches (KTOConfig.train_sampling_strategy) would each hold one label only."""
    return [{"prompt": r["prompt"], "completion": r[side], "label": side == "chosen"}
            for r in rows for side in ("chosen", "rejected")]


def unit_files(directory: Path, method: str) -> tuple[Path, Path]:
    """(rows, stats) of a preference method's units: KTO's examples or the pairs of the others."""
    if method == "kto":
        return directory / "kto.jsonl", directory / "kto_stats.json"
    return directory / "pairs.jsonl", directory / "pair_stats.json"


def _side_counts(tokenizer, rows: list[dict]) -> tuple[list[int], list[int], list[int]]:
    """Tokens of each pair's prompt (with the generation prompt), chosen and rejected answer."""
    def count(messages, generation=False):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompts = [count(r["prompt"], True) for r in rows]
    chosen = [count(r["prompt"] + r["chosen"]) - p for r, p in zip(rows, prompts)]
    rejected = [count(r["prompt"] + r["rejected"]) - p for r, p in zip(rows, prompts)]
    return prompts, chosen, rejected


def pair_stats(tokenizer, rows: list[dict], counts=None) -> dict:
    """Token percentiles of prompt and answers; `mean`: tokens of a pair (prompt + chosen +
    rejected, the template's tokens included), what pair_tokens_per_s counts; `mean_forward`: the
    same with the prompt twice (each side runs after it), what a forward sees; `mean_forward_shared`:
    what it sees with the prompt once (Fusetune's packed passes since 2026-12-05, jobs/data/pairs.py)."""
    prompts, chosen, rejected = counts or _side_counts(tokenizer, rows)

    def pct(values, p):
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    sides = {name: {"p50": pct(v, 0.5), "p90": pct(v, 0.9), "p99": pct(v, 0.99), "max": max(v)}
             for name, v in (("prompt", prompts), ("chosen", chosen), ("rejected", rejected))}
    pair = [p + c + r for p, c, r in zip(prompts, chosen, rejected)]
    forward = [2 * p + c + r for p, c, r in zip(prompts, chosen, rejected)]   # what a forward sees
    return {"pairs": len(rows), "mean": round(sum(pair) / len(pair), 1),
            "mean_forward": round(sum(forward) / len(forward), 1), "mean_forward_shared": round(sum(pair) / len(pair), 1),
            "longest_side": max(
        p + max(c, r) for p, c, r in zip(prompts, chosen, rejected)), **sides}


def kto_stats(counts) -> dict:
    """The same for kto_rows' examples. `mean`: prompt + completion of an example, counted once (what
    pair_tokens_per_s counts for KTO, as a pair's prompt is counted once for DPO); `mean_forward`:
    what a forward sees for it, the example and its KL sequence (its prompt + another example's
    completion; TRL rotates completions within a batch, Fusetune within the dataset,
    jobs/data/pairs.py). The KL completions are the completions permuted, so on average that is
    2 x (prompt + completion): a KTO example costs a forward what a pair does; with the prompt once
    (`mean_forward_shared`) the prompt and two completions."""
    prompts, chosen, rejected = counts
    examples = [p + a for p, c, r in zip(prompts, chosen, rejected) for a in (c, r)]
    mean = sum(examples) / len(examples)
    prompt_mean = sum(prompts) / len(prompts)
    return {"examples": len(examples), "desirable": len(prompts), "mean": round(mean, 1),
            "mean_forward": round(2 * mean, 1), "mean_forward_shared": round(2 * mean - prompt_mean, 1),
            "longest_side": max(examples)}


def write_preference_data(directory: Path, tokenizer, n: int, seed: int = 0) -> dict:
    """pairs.jsonl + pair_stats.json and, from the same pairs, kto.jsonl + kto_stats.json."""
    rows = pair_rows(n, seed)
    counts = _side_counts(tokenizer, rows)
    out = {}
    sets = (("dpo", rows, pair_stats(tokenizer, rows, counts)), ("kto", kto_rows(rows), kto_stats(counts)))
    for method, data, stats in sets:
        path, stats_path = unit_files(directory, method)
        write_jsonl(path, data)
        stats_path.write_text(json.dumps(stats))
        out[method] = stats
    return out
