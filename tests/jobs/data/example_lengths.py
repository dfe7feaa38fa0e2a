"""Examples of chosen lengths for packing and batch-plan tests (shared with the data-parallel tests)."""
import random

from jobs.data.encode import Example


def long_tailed(n: int, cap: int, seed: int = 0) -> list[int]:
    """`n` lengths from a log-normal (median ~220 tokens, a long tail), each within 8..cap: chat data's shape."""
    rng = random.Random(seed)
    return [min(cap, max(8, int(rng.lognormvariate(5.4, 0.9)))) for _ in range(n)]


def make_examples(lengths):
    """One example per length, token ids 1..n, the first label masked."""
    return [Example(list(range(1, n + 1)), [-100] + list(range(2, n + 1))) for n in lengths]
