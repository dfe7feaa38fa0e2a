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
SIZE = 512


def arithmetic_rows(n: int = SIZE, seed: int = 0) -> list[dict]:
    """`n` rows {prompt: [system, user], answer: "N"}, the same for the same seed."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text, solve = rng.choice(TEMPLATES)
        a, b = rng.randint(2, 20), rng.randint(1, 9)
        if solve(3, 2) == 1:   # subtraction: keep the answer positive
            a, b = max(a, b), min(a, b)
        question = text.format(name=rng.choice(NAMES), thing=rng.choice(THINGS), a=a, b=b)
        rows.append({"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                     "answer": str(solve(a, b))})
    return rows
