"""KTO's passes in the memory plan (issue 38): the forward with grad holds the completions alone.

A KTO training pass runs three forwards (jobs/train/methods/preference.py: the reference first, then
KTO.policy_sums): the reference policy over the whole units (no grad; with precompute_reference the
same passes once before the first step), the KL completions (no grad, as TRL's KTOTrainer computes its
KL log-probs), then the completions with grad and their backward. Only the last keeps activations from
layer to layer, so the checkpointing plan is sized for the completion tokens a pass holds.

How many those are depends on the data. A packed row's 2 x max_seq_length is shared by both halves of
its examples, and a row whose KL answers are tiny holds nearly a whole row of completions: from the
configuration alone a pass is bounded by its whole rows, and that bound stays wherever the data has
not been read (Start, --dry-run, least_budget and the refusal). A job encodes, packs and orders its units
before its plan (KTO.fit_sizes), so there a pass of k units is bounded by the most completion tokens k
units of one of the micro-batches it will train hold (jobs/data/pairs.py PairPlan.completion_bounds:
`completions`, whose first k summed are that bound), whichever k of them a pass, a rank's share
(packing.deal) or a stand-in takes. On the 1B KTO bench job (one packed row of 5,600 tokens a step)
a row holds 3,368 completion tokens on average but up to 5,248 (lengths as bench/pref_data.py makes them).

The forwards without grad keep nothing across layers. Their peak is one layer's forward over their
tokens (gate, up and their product, and the residual stream, norm, attention and MLP outputs:
3 I + 4 h values a token, as fit_rollout.py counts a prefill's) or the LM head's log-probs (one logits
chunk of kernels/ops/fused_linear_logprobs.py, and the hidden states with their label rows), whichever
is larger. The reference pass holds the whole units and the KL pass a part of the same tokens, so the
reference pass bounds both; a plan fits when the pass with grad and this floor both do."""
from __future__ import annotations

import dataclasses

from jobs.models.fit_estimate import GIB
from jobs.models.fit_plan import FLCE_CHUNK_BYTES

NO_GRAD_PART = "forward without grad (reference, KL)"


def grad_tokens(view, completions: tuple[int, ...]) -> int:
    """Completion tokens one pass of `view.batch_size` units holds at most (never more than its whole
    units); `completions`: the job's, entry k - 1 what k units hold more than k - 1."""
    return min(sum(completions[:view.batch_size]), view.batch_tokens())


def grad_view(view, completions: tuple[int, ...]):
    """`view` (one pass of batch_size units) as its forward with grad sizes memory: a JobSpec whose
    batch_tokens is the completions' bound, rounded up to a multiple of 2 x batch_size (a view, as
    fit_policy.policy_view makes GRPO's, so every part of the plan reads it unchanged)."""
    rows = 2 * view.batch_size
    return dataclasses.replace(view, max_seq_length=max(1, -(-grad_tokens(view, completions) // rows)))


def no_grad_bytes(shape, tokens: int, b: int) -> int:
    """The peak of a forward without grad over `tokens` beyond the static parts (module doc)."""
    layer = tokens * (3 * shape.inter + 4 * shape.hidden) * b
    head = min(FLCE_CHUNK_BYTES, tokens * shape.vocab * b) + 2 * tokens * shape.hidden * b
    return max(layer, head)


def floor(whole, part: int, shape, b: int, completions: tuple[int, ...] | None) -> int:
    """What a KTO pass of `part` units holds at least, whatever its plan: the reference pass over its
    whole units (`whole`: the job's spec). 0 without the job's completion counts: the pass with grad
    is then planned for whole units, which holds more than this (every layer's input and a recomputed
    layer's forward and backward over the same tokens)."""
    if not completions:
        return 0
    return no_grad_bytes(shape, dataclasses.replace(whole, batch_size=part).batch_tokens(), b)


def larger_phase(step: dict, whole, view, shape, b: int, completions: tuple[int, ...], notes: list) -> dict:
    """The estimate's parts of whichever phase peaks higher: the pass with grad (`step`, sized by
    `view`) or the forwards without grad, with a note naming both."""
    free = floor(whole, view.batch_size, shape, b, completions)
    held = sum(step.values())
    rows = dataclasses.replace(whole, batch_size=view.batch_size).batch_tokens()
    notes.append(f"kto: the forward with grad holds the completions alone, at most {grad_tokens(view, completions):,} "
                 f"of a pass's {rows:,} tokens in this job's batches ({held / GIB:.2f} GiB); the reference and KL "
                 f"forwards run without grad ({free / GIB:.2f} GiB)")
    return step if held >= free else {NO_GRAD_PART: free}
