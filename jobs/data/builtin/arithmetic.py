"""The built-in GRPO task `builtin:arithmetic`: small word problems with numeric answers,
generated offline from a seed (no download), in the shape GRPO prompt data has: a chat `prompt`
and an `answer` column the rewards compare against (jobs/train/rewards/builtin.py `answer`, and
`format` for the <answer> tags the system line asks for)."""
from __future__ import annotations

import random

SYSTEM = "Solve the problem. Put only the final number inside <answer></answer> tags, e.g. <answer>12</answer>."
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jun", "Kofi", "Lena"]
THINGS = ["apples", "books", "coins", "marbles", "pencils", "stickers", "shells", "cards"]
TEMPLATES = [
    ("{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", lambda a, b: a + b),
    ("{name} had {a} {thing} and gave away {b}. How many {thing} are left?", lambda a, b: a - b),
    ("{name} buys {a} bags with {b} {thing} in each. How many {thing} is that?", lambda a, b: a * b),
    ("What is {a} plus {b}?", lambda a, b: a + b),
    ("What is {a} minus {b}?", lambda a, b: a - b),
]
# One worked example before the question: a chat turn the model reads (prompt tokens, never
# trained on). Why: SmolLM2-135M, the built-in model, ignores the system line's tag instruction.
# Sampled at temperature 1.0 (16 prompts x 8 samples of up to 64 tokens), 0.4 % of its answers
# carried <answer> tags without the example and 31 % of groups scored all alike (no gradient); with
# it 18 % and 19 %. The studio's default job (60 steps, 2 CPU cores) without it never learned the
# tags (format 0 in 56 of 60 steps; reward 0.07 -> 0.29, first vs last 10 steps, in 21 min); with
# it format reaches 1.0 by step 16 and the answer follows (reward 0.31 -> 1.24 of 1.5 in 15 min).
# The rewards are unchanged. What is learned leans on the example: in a chat without it the tuned
# model wrote no tags (6 greedy answers).
EXAMPLE = [{"role": "user", "content": "Mia has 5 pens and gets 3 more. How many pens does Mia have now?"},
           {"role": "assistant", "content": "5 + 3 = 8. <answer>8</answer>"}]
SIZE = 512


def arithmetic_rows(n: int = SIZE, seed: int = 0) -> list[dict]:
    """`n` rows {prompt: [system, *EXAMPLE, user], answer: "N"}, the same for the same seed."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text, solve = rng.choice(TEMPLATES)
        a, b = rng.randint(2, 20), rng.randint(1, 9)
        if solve(3, 2) == 1:   # subtraction: keep the answer positive
            a, b = max(a, b), min(a, b)
        question = text.format(name=rng.choice(NAMES), thing=rng.choice(THINGS), a=a, b=b)
        rows.append({"prompt": [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": question}],
                     "answer": str(solve(a, b))})
    return rows
