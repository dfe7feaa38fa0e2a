"""KTO's training batches (jobs/data/pairs.py): with the reference sums precomputed the whole batch
carries no token tensors (units_only); each half counts its units. Synthetic units, no model: each
test takes milliseconds."""
import random

import pytest

from jobs.data.encode import IGNORE_INDEX, Example
from jobs.data.pairs import PairPlan, PairUnit, collate_half

SHARED = (64, 256)   # (hidden, MLP size): packed rows hold each prompt once
ROW = 128            # 2 x max_seq_length: every sequence here is under 64 tokens


def units(n=40, seed=0, kl_answer=None):
    """Examples of random prompt and answer lengths; `kl_answer`: every KL answer that long (tiny ones
    leave a packed row's room to the completions)."""
    rng, out = random.Random(seed), []
    for i in range(n):
        prompt, answer = rng.randint(3, 12), rng.randint(1, 40)
        other = kl_answer or rng.randint(1, 40)
        first = Example([1] * prompt + [2] * answer, [IGNORE_INDEX] * prompt + [2] * answer)
        second = Example([1] * prompt + [3] * other, [IGNORE_INDEX] * prompt + [3] * other)
        out.append(PairUnit(first, second, i % 2 == 0, i))
    return out


def plan(examples, packed, batch_size=3, **extra):
    return PairPlan(examples, batch_size, ROW, packed, 0, pad_id=0, kto_halves=True, shared=SHARED, **extra)


@pytest.mark.parametrize("packed", [True, False])
def test_with_the_reference_precomputed_the_whole_batch_carries_no_token_tensors(packed):
    """The step reads only the units' indices, labels and validity of the whole then; the halves and
    the counts are those of the full batch."""
    examples = units()
    full, lean = plan(examples, packed).batch_at(0)[1], plan(examples, packed, reference_given=True).batch_at(0)[1]
    assert set(lean.tensors) == {"pref_units", "pref_label", "pref_valid"} and "input_ids" in full.tensors
    assert (lean.real_tokens, lean.label_tokens) == (full.real_tokens, full.label_tokens)
    for key in lean.tensors:
        assert lean.tensors[key].equal(full.tensors[key])
    for mine, theirs in zip(lean.halves, full.halves):
        assert mine.tensors.keys() == theirs.tensors.keys()
        assert all(mine.tensors[k].equal(theirs.tensors[k]) for k in mine.tensors)


@pytest.mark.parametrize("packed", [True, False])
def test_a_half_counts_its_units(packed):
    half = collate_half(units(5), 0, 0, packed)
    assert half.label_tokens == 5 and half.real_tokens == sum(len(u.first.input_ids) for u in units(5))
