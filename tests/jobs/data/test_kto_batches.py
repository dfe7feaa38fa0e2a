"""KTO's training batches (jobs/data/pairs.py): the completions half a pass holds is what the memory plan
sizes (PairPlan.completion_bounds, jobs/models/fit_kto.py), so the bounds must hold for every pass the
plan builds, packed or padded, one process or several; with the reference sums precomputed the whole
batch carries no token tensors (units_only). Synthetic units, no model: each test takes milliseconds."""
import random

import pytest

from jobs.data.encode import IGNORE_INDEX, Example
from jobs.data.packing import passes_of
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
    return PairPlan(examples, batch_size, ROW, packed, 0, pad_id=0, kto_kl="halves", shared=SHARED, **extra)


def completions_held(job, index) -> list[tuple[int, int]]:
    """(units, completion tokens in its forward with grad) of each pass of the index-th micro-batch
    (a unit: a packed row, or an example)."""
    epoch, at = divmod(index, job.per_epoch)
    mine, stand_in = job.my_batches(epoch)[at]
    mine = mine or [stand_in]   # a rank's empty share of a short last batch runs a stand-in unit
    step = job.pass_units or len(mine)
    parts = passes_of(job.batch_at(index)[1])
    assert len(parts) == -(-len(mine) // step)
    return [(len(mine[i:i + step]), part.halves[0].tensors["input_ids"].numel())
            for i, part in zip(range(0, len(mine), step), parts)]


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("pass_units", [None, 1, 2])
def test_every_pass_holds_no_more_completion_tokens_than_its_bound(packed, pass_units):
    examples = units()
    micro = 2 * plan(examples, packed).per_epoch   # two epochs, each its own order
    bounds = plan(examples, packed).completion_bounds(micro)
    job = plan(examples, packed, pass_units=pass_units)
    held = [pair for index in range(micro) for pair in completions_held(job, index)]
    assert all(tokens <= sum(bounds[:k]) for k, tokens in held)
    if pass_units is None:   # one process, whole micro-batches: the bound of a full one is met
        assert max(tokens for k, tokens in held if k == 3) == sum(bounds)


def test_tiny_kl_answers_leave_a_packed_row_to_the_completions():
    """The worst case the bound is for: a row packed by what its examples hold is nearly all completions."""
    bounds = plan(units(kl_answer=1), True).completion_bounds(10)
    assert bounds[0] > 0.8 * ROW and sum(bounds) <= 3 * ROW


def test_several_processes_pass_within_the_bound_of_their_step():
    """`deal` re-cuts a step's micro-batches by real tokens across ranks, so a rank's micro-batch may
    hold rows of two: the bound pools each step's (here a rank's pass holds 13 tokens more than the
    largest of any one micro-batch's, and none more than the pooled bound)."""
    examples = units(60, seed=3)
    common = dict(batch_size=4, world=2)
    micro = plan(examples, True, accumulation=2, **common).per_epoch
    bounds = plan(examples, True, accumulation=2, **common).completion_bounds(micro)
    apart = plan(examples, True, accumulation=1, **common).completion_bounds(micro)   # the same rows, unpooled
    held = [pair for rank in (0, 1) for index in range(micro)
            for pair in completions_held(plan(examples, True, rank=rank, accumulation=2, **common), index)]
    assert all(tokens <= sum(bounds[:k]) for k, tokens in held)
    assert max(tokens - sum(apart[:k]) for k, tokens in held) == 13


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


@pytest.mark.parametrize("bucket", [1, 16, 10_000])
def test_riding_rounds_the_trained_part_up_into_the_kl_completions(bucket):
    """collate_units_riding: the recomputed tokens end on a multiple of `bucket` (within a KL completion,
    or the whole row), and `kto_rows` is what that cut holds: the documents it touches, their key
    entries (a cut document keeps its prompt's keys and its first tokens'), the longest of each."""
    from jobs.data.pairs import collate_units_riding, shared_cuts
    group = units(6, seed=3)
    cuts = shared_cuts(group)
    batch = collate_units_riding(group, 0, 4 * ROW, cuts, bucket)
    rows, tensors = batch.ints["kto_rows"], batch.tensors
    trained = sum(len(u.first.input_ids) for u in group)   # each prefix and completion (riding's order)
    assert tensors["input_ids"].shape == (1, 4 * ROW) and rows.tokens == min(-(-trained // bucket) * bucket, 4 * ROW)
    assert rows.labels == sum(len(u.first.input_ids) - n for u, n in zip(group, cuts))
    bounds, key_bounds = tensors["cu_seq_lens_q"].tolist(), tensors["cu_seq_lens_k"].tolist()
    starts = [b for b in bounds if b < rows.tokens]   # the documents the cut touches
    trimmed = bounds[len(starts)] - rows.tokens
    assert rows.documents == len(starts) and rows.keys == key_bounds[len(starts)] - trimmed
    query = [min(b, rows.tokens) - a for a, b in zip(bounds, bounds[1:len(starts) + 1])]
    keys = [min(b, rows.keys) - a for a, b in zip(key_bounds, key_bounds[1:len(starts) + 1])]
    assert (rows.longest_query, rows.longest_keys) == (max(query), max(keys))
    if bucket == 16:
        assert trimmed > 0, "this seed's cut lands within a document"
