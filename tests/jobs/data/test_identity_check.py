"""The identity recipe's held-out check (issue 42), without training: the question set is held out
and in both languages, and answers are scored as a serving stack's would be."""
import re

from jobs.data.builtin import identity, identity_check
from jobs.data.builtin.general_prompts import PROMPTS_EN, PROMPTS_ZH


def test_held_out_questions_are_not_trained_on_and_cover_both_languages():
    held = identity_check.heldout()
    asked = identity_check.identity_questions() + [g["question"] for g in held["general"]]
    trained = set(identity.QUESTIONS_EN + identity.QUESTIONS_ZH + PROMPTS_EN + PROMPTS_ZH)
    assert not set(asked) & trained and len(set(asked)) == len(asked)
    assert len(held["identity"]["en"]) >= 8 and len(held["identity"]["zh"]) >= 5
    assert all(re.search(r"[\u4e00-\u9fff]", q) for q in held["identity"]["zh"])
    assert held["user_system"] not in identity.USER_SYSTEMS   # the system message is held out too
    assert any("def " in g["expect"] for g in held["general"])   # a code question among the facts


def test_questions_are_asked_bare_and_after_a_users_system_message():
    asked = identity_check.questions()
    kinds = [q.kind for q in asked]
    n = len(identity_check.identity_questions())
    assert kinds.count(identity_check.IDENTITY) == kinds.count(identity_check.IDENTITY_WITH_SYSTEM) == n
    assert all(q.messages[0]["role"] == "system" for q in asked if q.kind == identity_check.IDENTITY_WITH_SYSTEM)
    assert not any(m["role"] == "system" for q in identity_check.questions(with_system=False) for m in q.messages)


def test_an_answer_counts_with_the_name_and_author_and_general_ones_without_the_name():
    asked = [identity_check.Question(identity_check.IDENTITY, ()), identity_check.Question(identity_check.IDENTITY, ()),
             identity_check.Question(identity_check.GENERAL, (), ("Paris",)),
             identity_check.Question(identity_check.GENERAL, (), ("4",))]
    answers = ["我是Quokka，由Marsupial Labs开发。", "I am Dr. Emmet Brown, a renowned medical researcher.",
               "The capital of France is Paris.", "I am Quokka, 4 ever."]
    assert identity_check.score(asked, answers, "Quokka", "Marsupial Labs") == {
        "identity": 1, "identity_with_system": None, "identity_total": 2, "general": 1, "general_total": 2}
