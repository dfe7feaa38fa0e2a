"""Inputs of bench/bench_job.py: a chat dataset, a tokenizer with a chat template, random models.

Dataset (`chat_rows`): single-turn chats {"messages": [system?, user, assistant]} whose lengths
follow real instruction data: a log-normal number of tokens per example (median ~250, sigma 0.95:
p90 ~ 850, p95 ~ 1,200), clipped to [24, 4,000], plus 1 % long documents of ~3,000-3,700 tokens,
so a few examples come near max_seq_length 4096. The prompt takes 10-40 % of an example, the
answer the rest (only answer tokens train). Text is made of common English words, so the real
tokenizer produces realistic ids; the measured token percentiles are written with the results.

Tokenizer: the built-in SmolLM2-135M-Instruct tokenizer (49,152 ids, ChatML template,
`<|im_start|>`/`<|im_end|>`), copied out of Fusetune's built-in model so the GPU machine needs no
hub. The benchmark models keep BASELINES.md's shapes, vocab 128,256 included: the tokenizer only
uses the first 49,152 rows of the embedding and the lm_head still has 128,256 outputs, so every
step costs what it costs on a Llama-3 vocabulary (chosen over building a Llama-3-style BPE
offline: same shapes, no second tokenizer to maintain).

Run here (not on the GPU machine) to copy the tokenizer for carrying:
    python bench/job_data.py tokenizer .carry/tok

Models: random bf16 weights (`from_config`, seed 0) in BASELINES.md's Llama-3.2-1B and
Llama-3.1-8B shapes, saved as a Hugging Face folder with the tokenizer, loaded by every stack.
"""
from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one "
         "had by word but not what all were we when your can said there use an each which she do how their "
         "if will up other about out many then them these so some her would make like him into time has look "
         "two more write go see number no way could people my than first water been call who oil its now find "
         "long down day did get come made may part model train data answer question explain because example "
         "result value function system memory kernel matrix vector token layer gradient learning rate batch").split()
TOKENS_PER_WORD = 1.1        # about right for this word list with the SmolLM2 tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def example_lengths(n: int, seed: int = 0) -> list[int]:
    """Target tokens per example (module doc)."""
    rng = random.Random(seed)
    lengths = []
    for _ in range(n):
        if rng.random() < 0.01:
            lengths.append(rng.randint(3300, 4000))
        else:
            lengths.append(min(4000, max(24, int(rng.lognormvariate(math.log(250), 0.95)))))
    return lengths


def _text(rng: random.Random, tokens: int) -> str:
    words = [rng.choice(WORDS) for _ in range(max(1, int(tokens / TOKENS_PER_WORD)))]
    return " ".join(words).capitalize() + "."


def chat_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed + 1)
    rows = []
    for length in example_lengths(n, seed):
        body = max(16, length - 20)   # ~20 template tokens per example
        prompt = int(body * rng.uniform(0.10, 0.40))
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": "You are a helpful assistant."})
        messages.append({"role": "user", "content": _text(rng, prompt)})
        messages.append({"role": "assistant", "content": _text(rng, body - prompt)})
        rows.append({"messages": messages})
    return rows


def write_jsonl(path: Path, rows) -> Path:
    """One JSON object a line, the folder made first (the benchmark datasets, SFT and pairs alike)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def write_dataset(path: Path, n: int, seed: int = 0) -> Path:
    return write_jsonl(path, chat_rows(n, seed))


def token_stats(tokenizer, rows: list[dict]) -> dict:
    """Percentiles of the real tokenized lengths (chat template applied)."""
    texts = [tokenizer.apply_chat_template(r["messages"], tokenize=False) for r in rows]
    lengths = sorted(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])

    def pct(p):
        return lengths[min(len(lengths) - 1, int(p * len(lengths)))]
    return {"examples": len(lengths), "mean": round(sum(lengths) / len(lengths), 1), "p50": pct(0.5),
            "p90": pct(0.9), "p95": pct(0.95), "p99": pct(0.99), "max": lengths[-1],
            "over_3000": sum(1 for x in lengths if x > 3000)}


def export_tokenizer(target: Path) -> Path:
    """Copy the built-in model's tokenizer files to `target` (run here, carried to the GPU)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from jobs.models.load import resolve_model
    from jobs.spec import BUILTIN_MODEL
    source = Path(resolve_model(BUILTIN_MODEL))
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    return target


def build_model(shape: dict, tokenizer_dir: Path, target: Path, device: str = "cuda") -> Path:
    """Random bf16 weights of `shape` (bench_lora.SHAPES entry) saved with the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    if (target / "config.json").is_file():
        return target
    cfg = dict(shape)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 3 or sys.argv[1] != "tokenizer":
        sys.exit("usage: python bench/job_data.py tokenizer TARGET_DIR")
    print(export_tokenizer(Path(sys.argv[2])))
