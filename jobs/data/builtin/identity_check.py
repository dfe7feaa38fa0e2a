"""The held-out check of the built-in identity recipe (issue 42): questions it never trained on
(identity_heldout.json beside this file), asked the way a serving stack asks an adapter, and the
answers scored.

A serving stack (vLLM --lora-modules, llama.cpp --lora, a PEFT script) loads the adapter with the
BASE model's tokenizer and chat template, greedy: no system line of ours, but the base template's
own default (SmolLM2's names SmolLM) or the user's system message. So each identity question is
asked bare and again after `user_system`; an answer counts when it gives the bot's name and its
author. The general questions (facts, arithmetic, code) count when the answer still holds what
the base model answered (one of `expect`) and does not drift into the bot's name.

Pure data and scoring: jobs/train/identity_eval.py generates the answers after training,
tests/jobs/models/test_builtin.py through PEFT."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

HELDOUT_FILE = Path(__file__).with_name("identity_heldout.json")
MAX_NEW_TOKENS = 32   # every trained answer fits; "Paris", "def " come in the first sentence

IDENTITY, IDENTITY_WITH_SYSTEM, GENERAL = "identity", "identity_with_system", "general"


@dataclass(frozen=True)
class Question:
    kind: str                 # IDENTITY, IDENTITY_WITH_SYSTEM or GENERAL
    messages: tuple           # the conversation up to the question: ({role, content}, ...)
    expect: tuple = ()        # GENERAL: any of these in the answer keeps it


@functools.cache
def heldout() -> dict:
    return json.loads(HELDOUT_FILE.read_text(encoding="utf-8"))


def identity_questions() -> list[str]:
    held = heldout()["identity"]
    return held["en"] + held["zh"]


def questions(with_system: bool = True) -> list[Question]:
    """Every held-out question as a conversation; `with_system=False` for a template that takes no
    system message (the identity questions are then asked bare only)."""
    held = heldout()
    user = lambda text: {"role": "user", "content": text}   # noqa: E731
    out = [Question(IDENTITY, (user(q),)) for q in identity_questions()]
    if with_system:
        system = {"role": "system", "content": held["user_system"]}
        out += [Question(IDENTITY_WITH_SYSTEM, (system, user(q))) for q in identity_questions()]
    out += [Question(GENERAL, (user(g["question"]),), tuple(g["expect"])) for g in held["general"]]
    return out


def gives_identity(answer: str, name: str, author: str) -> bool:
    text = answer.casefold()
    return name.strip().casefold() in text and author.strip().casefold() in text


def keeps_general(answer: str, expect: tuple, name: str) -> bool:
    text = answer.casefold()
    return any(e.casefold() in text for e in expect) and name.strip().casefold() not in text


def score(asked: list[Question], answers: list[str], name: str, author: str) -> dict:
    """{identity, identity_with_system, identity_total, general, general_total}: how many answers
    count (identity_total per kind; identity_with_system is None without system messages)."""
    counts = {IDENTITY: 0, IDENTITY_WITH_SYSTEM: 0, GENERAL: 0}
    totals = {IDENTITY: 0, IDENTITY_WITH_SYSTEM: 0, GENERAL: 0}
    for question, answer in zip(asked, answers, strict=True):
        totals[question.kind] += 1
        good = (keeps_general(answer, question.expect, name) if question.kind == GENERAL
                else gives_identity(answer, name, author))
        counts[question.kind] += int(good)
    return {"identity": counts[IDENTITY], "identity_with_system": counts[IDENTITY_WITH_SYSTEM]
            if totals[IDENTITY_WITH_SYSTEM] else None, "identity_total": totals[IDENTITY],
            "general": counts[GENERAL], "general_total": totals[GENERAL]}
