"""The base model's own answers to the shipped general prompts, generated once per base model.

Mixed into the identity dataset so that a few dozen steps on "who are you" do not overwrite the
model's other answers: a replay of the model's own outputs, the self-distillation idea used
against forgetting (e.g. "Self-Distillation Bridges Distribution Gap in Language Model
Fine-Tuning", Yang et al. 2024). Greedy, batched (left padding) generation; the answers are cached
as JSON under the data dir's model cache, keyed by the model and the generation settings.

The built-in model's answers ship with Fusetune (`SHIPPED`, the same file under its cache key, generated
by this code in fp32 on a CPU: `python -m tests.builtin_home` remakes it when the prompts or settings
change, and tests/jobs/models/test_builtin.py checks it against a fresh generation), so a newcomer's
first identity job starts training without minutes of generation and the Train tab previews the whole
mix at once. Any other model generates its own on its first identity or concise job."""
from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import tempfile
import time
import zlib
from pathlib import Path

from jobs.data.builtin.general_prompts import PROMPTS_EN, PROMPTS_ZH
from jobs.io import phases

# 64 new tokens, cut back to the last full sentence: short rows keep the default run fast. One
# batch of 64 prompts costs about as much per step as one of 16 on a CPU (the matrix products are
# too small to be compute-bound), so the 121 prompts take two batches (~3 CPU-minutes, once).
MAX_NEW_TOKENS = 64
BATCH_SIZE = 64
# Answers naming another assistant or maker would contradict the new identity; they are left out.
FOREIGN_NAMES = re.compile(r"smollm|hugging\s*face|openai|chatgpt|\bclaude\b|\bllama\b|\bqwen\b", re.I)
REPETITIVE_RATIO = 0.5  # zlib-compressed / raw size below this: a loop such as "煮米饭！煮米饭！…"
SENTENCE_END = re.compile(r"[.!?。！？\n](?=[^.!?。！？\n]*$)")
SHIPPED = Path(__file__).with_name("answers")   # the built-in model's, by cache key (module doc)


def prompts() -> list[str]:
    return PROMPTS_EN + PROMPTS_ZH


def cache_file(model_cache: Path, source: str) -> Path:
    """Where the answers of `source` (a model folder or hub id) live: one file per model and
    generation settings, so changing the prompts or settings regenerates them."""
    settings = json.dumps([prompts(), MAX_NEW_TOKENS], ensure_ascii=False)
    key = hashlib.sha1(f"{_model_key(model_cache, source)}\n{settings}".encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", source.rstrip("/").split("/")[-1])[:40] or "model"
    return Path(model_cache) / "general-answers" / f"{slug}-{key}.json"


def _model_key(model_cache: Path, source: str) -> str:
    """A model inside the cache (the converted built-in model) by its path there, so that a data
    dir moved or copied elsewhere keeps its answers; any other folder or hub id as given."""
    if not Path(source).is_absolute():
        return source   # a hub id
    try:
        return Path(source).resolve().relative_to(Path(model_cache).resolve()).as_posix()
    except ValueError:
        return source


def answers_file(model_cache: Path, source: str) -> Path | None:
    """Where the answers of `source` are: the data dir's cache, else the shipped file (the key names the model
    and the settings, so only the built-in model's is there), else None."""
    own = cache_file(model_cache, source)
    return next((path for path in (own, SHIPPED / own.name) if path.is_file()), None)


def cached_answers(model_cache: Path, source: str) -> list[dict[str, str]] | None:
    """The answers of `source` from the data dir's cache, else shipped (the built-in model's), else None."""
    path = answers_file(model_cache, source)
    return None if path is None else json.loads(path.read_text(encoding="utf-8"))["answers"]


def shipped(model_cache: Path, source: str) -> bool:
    """Whether the answers of `source` are the shipped ones (none generated into this data dir)."""
    path = answers_file(model_cache, source)
    return path is not None and path.parent == SHIPPED


IDENTITY_USE = "the identity dataset mixes them in so the model keeps its general knowledge"


def base_answers(model_cache: Path, source: str, log=print, load_in_4bit: bool = False,
                 use: str = IDENTITY_USE) -> list[dict[str, str]]:
    """[{prompt, answer}] of the base model, from the cache or generated now and cached (with the
    base weights in 4-bit for a QLoRA job, so generating never needs more memory than training)."""
    cached = cached_answers(model_cache, source)
    if cached is not None:
        if shipped(model_cache, source):
            log(f"the base model's answers to {len(prompts())} general prompts: the ones shipped for the built-in "
                f"model ({len(cached)} kept; {use})")
        return cached
    began = time.time()
    log(f"generating the base model's answers to {len(prompts())} general prompts (once per model); {use}")
    answers = usable(generate(source, prompts(), load_in_4bit))
    log(f"kept {len(answers)} of {len(prompts())} answers in {time.time() - began:.0f}s")
    _write_atomically(cache_file(model_cache, source), {"source": source, "answers": answers})
    return answers


def usable(generated: list[tuple[str, str, bool]]) -> list[dict[str, str]]:
    """Answers worth replaying: complete ones, and cut ones trimmed back to their last full
    sentence (when that keeps at least half); none that names another assistant or loops."""
    kept = []
    for prompt, answer, finished in generated:
        answer = answer.strip()
        if not finished:
            end = SENTENCE_END.search(answer)
            answer = answer[:end.end()].strip() if end and end.end() >= len(answer) // 2 else ""
        if answer and not FOREIGN_NAMES.search(answer) and not _repetitive(answer):
            kept.append({"prompt": prompt, "answer": answer})
    return kept


def _repetitive(text: str) -> bool:
    raw = text.encode()
    return len(raw) >= 40 and len(zlib.compress(raw)) / len(raw) < REPETITIVE_RATIO


def generate(source: str, questions: list[str], load_in_4bit: bool = False) -> list[tuple[str, str, bool]]:
    """(prompt, greedy answer, finished before MAX_NEW_TOKENS) for each question, in order."""
    import torch

    from jobs.data import encode
    from jobs.models import load as models
    tokenizer = models.load_tokenizer(source)
    encode.ensure_chat_template(tokenizer)
    tokenizer.padding_side = "left"  # batched generation continues every row from its last token
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = models.load_base_model(source, dtype, device, load_in_4bit=load_in_4bit)
    model.eval()
    try:
        return _generate_batches(model, tokenizer, questions, device)
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the trainer loads its own copy next


class _Progress:
    """A stopping criterion that never stops: called after every generated token, it reports the
    answers done so far with the phase's remaining time (from the tokens' pace), so that the page's
    "preparing data: 0/121 answers" moves during a batch's minute instead of only after it."""

    def __init__(self, questions: int, batches: int):
        self.questions, self.tokens_total = questions, batches * MAX_NEW_TOKENS
        self.done, self.tokens, self.began = 0, 0, time.monotonic()

    def __call__(self, input_ids, scores, **kwargs):
        import torch
        self.tokens += 1
        pace = (time.monotonic() - self.began) / self.tokens
        phases.report(phases.PREPARING, self.done, self.questions, "answers",
                      eta_s=pace * (self.tokens_total - self.tokens))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def batch_ended(self, done: int, batch_tokens: int) -> None:
        # a batch that ended early (every row at its end) frees its unused token budget
        self.done, self.tokens_total = done, self.tokens_total - (MAX_NEW_TOKENS - batch_tokens)
        phases.report(phases.PREPARING, done, self.questions, "answers")


def _generate_batches(model, tokenizer, questions: list[str], device) -> list[tuple[str, str, bool]]:
    import torch
    from transformers import StoppingCriteriaList
    order = sorted(range(len(questions)), key=lambda i: len(questions[i]))  # similar lengths batch well
    results: dict[int, tuple[str, str, bool]] = {}
    progress = _Progress(len(questions), -(-len(order) // BATCH_SIZE))
    phases.report(phases.PREPARING, 0, len(questions), "answers")
    for start in range(0, len(order), BATCH_SIZE):
        batch = order[start:start + BATCH_SIZE]
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": questions[i]}], tokenize=False,
                                               add_generation_prompt=True) for i in batch]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, stopping_criteria=StoppingCriteriaList([progress]))
        for row, i in enumerate(batch):
            new = out[row, inputs["input_ids"].shape[1]:].tolist()
            finished = tokenizer.eos_token_id in new
            text = tokenizer.decode(new, skip_special_tokens=True)
            results[i] = (questions[i], text, finished)
        progress.batch_ended(len(results), out.shape[1] - inputs["input_ids"].shape[1])
    return [results[i] for i in range(len(questions))]


def _write_atomically(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, ensure_ascii=False, indent=1)
    os.replace(tmp, path)
