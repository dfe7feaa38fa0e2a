"""The built-in `concise` preference set: the base model's own answers, the short one preferred.

For each shipped general prompt (jobs/data/builtin/general_prompts.py) the base model's greedy
answer is generated once and cached (the same cache the identity dataset uses, general.py). The
pair is made from that one answer:

- chosen: its opening sentence(s), cut at a sentence end once at least MIN_CHOSEN_CHARS are kept;
- rejected: the whole answer.

Both sides are the model's own words, so the pair teaches one thing only: stop after the point is
made (the log-probs of the shared opening cancel against the reference; what differs is the end
of turn after the opening versus going on). Alone, such pairs let DPO find a shortcut: end of turn
is good anywhere, and the tuned model answered nothing at all (measured on the built-in model). So
each answer also gives a second pair, the opening preferred over the opening cut after a third of
its words: stopping before the point is made is the rejected side there. That keeps the facts: "The capital of Italy is Rome."
is the chosen side of its pair, and DPO moves the policy towards it. The idea of preferring the
shorter of two otherwise acceptable answers is the length-preference setup of e.g. "Disentangling
Length from Quality in Direct Preference Optimization" (Park et al. 2024), used here the other way
round: as a visible, harmless effect for a demo.

Rows are in TRL's conversational preference form (prompt / chosen / rejected as message lists), so
the chat template is applied exactly as in Chat."""
from __future__ import annotations

import re
from pathlib import Path

from jobs.spec import BUILTIN_CONCISE

# A chosen side shorter than this many UTF-8 bytes (after cutting at a sentence end) takes the next
# sentence too: "Sure!" alone is not an answer. Bytes, not characters, so that a Chinese sentence
# (3 bytes a character) is measured about as an English one of the same content.
MIN_CHOSEN_BYTES = 24
# A pair is kept only when the chosen side is clearly shorter: at most this share of the rejected
# one (in bytes).
MAX_CHOSEN_SHARE = 0.7
SENTENCE = re.compile(r".+?(?:[.!?](?=\s|$)|[。！？]|\n+|$)", re.S)

# Held out from training (none of them is a general prompt): what the demo test and a user ask
# after tuning. The first checks a fact survives; the others are open questions that invite a
# long answer.
HELDOUT_PROMPTS = [
    "What is the capital of France?",
    "Why do leaves change color in autumn?",
    "How do plants make their food?",
    "What is the water cycle?",
    "Why do we need sleep?",
    "How does a refrigerator keep food cold?",
    "What causes earthquakes?",
    "Why is drinking water good for you?",
    "How do vaccines work?",
]


def concise_answer(answer: str) -> str:
    """The opening sentence(s) of `answer`: whole sentences until MIN_CHOSEN_BYTES are kept, never
    ending on a colon (what follows "Here is how:" is the answer)."""
    kept = ""
    for match in SENTENCE.finditer(answer.strip()):
        kept += match.group(0)
        if _size(kept.strip()) >= MIN_CHOSEN_BYTES and kept.rstrip()[-1:] not in (":", "："):
            break
    return kept.strip()


def _size(text: str) -> int:
    return len(text.encode())


def cut_short(opening: str) -> str:
    """The opening cut after about a third of it, at a word boundary where it has spaces."""
    words = opening.split(" ")
    if len(words) >= 3:
        return " ".join(words[:max(1, len(words) // 3)])
    return opening[:max(1, len(opening) // 3)]


def _pair(prompt: str, chosen: str, rejected: str) -> dict:
    return {"prompt": [{"role": "user", "content": prompt}],
            "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}]}


def preference_pair(prompt: str, answer: str) -> dict | None:
    """One conversational preference row from an answer, or None when it makes no clear pair
    (the answer is already one sentence, or its opening is most of it)."""
    answer = answer.strip()
    chosen = concise_answer(answer)
    if not chosen or _size(chosen) > MAX_CHOSEN_SHARE * _size(answer):
        return None
    return _pair(prompt, chosen, answer)


def concise_rows(answers: list[dict[str, str]]) -> list[dict]:
    """The preference rows of the base model's answers ([{prompt, answer}], general.py): for each,
    the opening over the whole answer, and the opening over the opening cut short."""
    rows = []
    for item in answers:
        pair = preference_pair(item["prompt"], item["answer"])
        if pair is not None:
            opening = pair["chosen"][0]["content"]
            rows += [pair, _pair(item["prompt"], opening, cut_short(opening))]
    return rows


def concise_dataset(model_cache: Path, source: str, log=print, load_in_4bit: bool = False,
                    generate: bool = True) -> list[dict] | None:
    """The rows for base model `source`: from the cached answers, or generated now (once per
    model) when `generate`; None when they are not cached and `generate` is off (a preview)."""
    from jobs.data.builtin import general
    if generate:
        answers = general.base_answers(model_cache, source, log=log, load_in_4bit=load_in_4bit,
                                       use=f"{BUILTIN_CONCISE} makes its preference pairs from them")
    else:
        answers = general.cached_answers(model_cache, source)
        if answers is None:
            return None
    rows = concise_rows(answers)
    log(f"{BUILTIN_CONCISE}: {len(rows)} preference pairs from {len(answers)} of the base model's answers "
        "(chosen: the opening sentence(s); rejected: the whole answer, or the opening cut short)")
    return rows
