"""Built-in rewards, each (prompts, completions, **columns) -> list[float] like TRL's reward
functions. A completion is a string, or (chat prompts) a list with one assistant message.

answer        1 when the completion's final answer equals the row's `answer`: taken from the last
              \\boxed{...}, else the last <answer>...</answer>, else the last number; compared as
              numbers when both sides are numbers (1,000 = 1000 = 1e3), else as trimmed text.
format        1 for an <answer>...</answer> (or, with a `format_regex` column, a match of that
              regex), 0.5 for an opening <answer> tag alone, else 0.
think_format  1 for the R1 layout <think>...</think> then <answer>...</answer> and nothing else.
length        -(completion tokens / max_completion_length): a penalty in [-1, 0].
json          1 when the completion (or its ```json fenced block) parses as JSON."""
from __future__ import annotations

import json
import math
import re

from jobs.spec import BUILTIN_REWARDS

NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
THINK_LAYOUT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.S)
FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def text_of(completion) -> str:
    """The text of a completion: a string, or the content of a message list's messages."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))


def extract_answer(text: str) -> str | None:
    """The final answer of a completion (module doc), or None when it has none."""
    for pattern in (BOXED, ANSWER_TAG):
        found = pattern.findall(text)
        if found:
            return found[-1].strip()
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def as_number(text) -> float | None:
    try:
        value = float(str(text).strip().replace(",", "").rstrip("."))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def same_answer(given: str | None, expected) -> bool:
    if given is None or expected is None:
        return False
    a, b = as_number(given), as_number(expected)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return given.strip().lower() == str(expected).strip().lower()


def answer(prompts, completions, answer=None, **_) -> list[float]:
    expected = answer if answer is not None else [None] * len(completions)
    return [1.0 if same_answer(extract_answer(text_of(c)), e) else 0.0 for c, e in zip(completions, expected)]


def format(prompts, completions, format_regex=None, **_) -> list[float]:  # noqa: A001 (the reward's name)
    scores = []
    for i, completion in enumerate(completions):
        text = text_of(completion)
        if format_regex is not None and format_regex[i]:
            scores.append(1.0 if re.search(format_regex[i], text, re.S) else 0.0)
        else:
            scores.append(1.0 if ANSWER_TAG.search(text) else 0.5 if "<answer>" in text else 0.0)
    return scores


def think_format(prompts, completions, **_) -> list[float]:
    return [1.0 if THINK_LAYOUT.match(text_of(c)) else 0.0 for c in completions]


def length(prompts, completions, completion_lengths=None, max_completion_length=None, **_) -> list[float]:
    if completion_lengths is None or not max_completion_length:
        return [-min(1.0, len(text_of(c)) / 1000) for c in completions]
    return [-min(1.0, n / max_completion_length) for n in completion_lengths]


def json_reward(prompts, completions, **_) -> list[float]:
    scores = []
    for completion in completions:
        text = text_of(completion).strip()
        fenced = FENCE.search(text)
        try:
            json.loads(fenced.group(1) if fenced else text)
            scores.append(1.0)
        except ValueError:
            scores.append(0.0)
    return scores


BUILTIN = {"answer": answer, "format": format, "think_format": think_format, "length": length,
           "json": json_reward}
assert tuple(BUILTIN) == BUILTIN_REWARDS, "jobs/spec.py BUILTIN_REWARDS names the same rewards"
