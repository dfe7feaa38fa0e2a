"""GRPO's static-cache decode loop (jobs/train/decode.py) against transformers' `generate` on the
tiny Llama with a LoRA adapter on (fp32, CPU, eager step): greedy gives exactly generate's tokens
for left-padded prompts of different lengths, EOS stops a row, sampling with a seed repeats, and
top-p keeps what transformers' TopPLogitsWarper keeps."""
import pytest
import torch

from jobs.train import decode
from jobs.train.rollout import cut_at_eos, pad_left, sample_completions

PROMPTS = [[5, 17, 33, 40, 2, 9, 81], [12, 7], [99, 100, 101, 3], [44]]


def _generate_greedy(model, ids, mask, max_new, eos, pad_id):
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                         pad_token_id=pad_id, eos_token_id=eos, use_cache=True)
    return [cut_at_eos(row, {eos}) for row in out[:, ids.shape[1]:].tolist()]


def _ours(model, ids, mask, max_new, eos, pad_id, temperature=0.0, top_p=1.0):
    out = decode.decode(model, ids, mask, max_new, temperature, top_p, {eos}, pad_id, use_graph=False)
    return [cut_at_eos(row, {eos}) for row in out.tolist()]


def test_greedy_decoding_gives_exactly_the_tokens_of_generate_for_left_padded_prompts(policy):
    model, tok = policy
    ids, mask = pad_left(PROMPTS, tok.pad_token_id, "cpu")
    never = 10_000   # no EOS: every row runs to the limit
    ours = _ours(model, ids, mask, 24, never, tok.pad_token_id)
    assert all(len(row) == 24 for row in ours)
    assert ours == _generate_greedy(model, ids, mask, 24, never, tok.pad_token_id)


def test_a_row_stops_at_its_eos_as_in_generate(policy):
    model, tok = policy
    ids, mask = pad_left(PROMPTS, tok.pad_token_id, "cpu")
    free = _ours(model, ids, mask, 20, 10_000, tok.pad_token_id)
    eos = free[0][4]                                  # a token row 0 emits early
    ours = _ours(model, ids, mask, 20, eos, tok.pad_token_id)
    assert ours == _generate_greedy(model, ids, mask, 20, eos, tok.pad_token_id)
    assert len(ours[0]) <= 5 and ours[0][-1] == eos
    raw = decode.decode(model, ids, mask, 20, 0.0, 1.0, {eos}, tok.pad_token_id, use_graph=False)
    stop = len(ours[0])
    assert raw[0, stop:].eq(tok.pad_token_id).all()   # after EOS a row only gets pad


def test_the_loop_gives_the_same_tokens_while_packed_attention_is_on(policy):
    from kernels.packed_attention import restore_attention, use_packed_attention

    model, tok = policy   # a packed grpo job switches the attention for its policy pass; sampling reads 4-D masks
    ids, mask = pad_left(PROMPTS, tok.pad_token_id, "cpu")
    want = _ours(model, ids, mask, 12, 10_000, tok.pad_token_id)
    use_packed_attention(model)
    try:
        assert _ours(model, ids, mask, 12, 10_000, tok.pad_token_id) == want
    finally:
        restore_attention(model)


def test_sampling_with_a_fixed_seed_repeats_and_differs_from_greedy(policy):
    model, tok = policy
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(sample_completions(model, tok, PROMPTS[:2], 4, 16, 1.0, 0.9, "cpu", use_graph=False))
    assert runs[0] == runs[1] and len(runs[0]) == 8
    ids, mask = pad_left([p for p in PROMPTS[:2] for _ in range(4)], tok.pad_token_id, "cpu")
    eos = {tok.eos_token_id}
    greedy = [cut_at_eos(r, eos) for r in decode.decode(model, ids, mask, 16, 0.0, 1.0, eos, tok.pad_token_id,
                                                        use_graph=False).tolist()]
    assert runs[0] != greedy
    assert len({tuple(r) for r in runs[0][:4]}) > 1   # a group's completions differ


def test_sampling_in_passes_within_a_budget_gives_the_tokens_of_one_pass(policy):
    """rows_per_pass (a memory budget, jobs/models/fit_rollout.py) splits the completions into
    passes with a KV cache each, padded to their own longest prompt: greedy tokens are the same and
    in the same order, a short last pass included."""
    model, tok = policy
    whole = sample_completions(model, tok, PROMPTS, 2, 12, 0.0, 1.0, "cpu", use_graph=False)
    passes = sample_completions(model, tok, PROMPTS, 2, 12, 0.0, 1.0, "cpu", use_graph=False, rows_per_pass=3)
    assert len(whole) == 8 and passes == whole


def test_a_groups_prompt_is_prefilled_once_and_its_rows_decode_as_if_each_had_its_own(policy):
    """GRPO's rows come in runs of num_generations equal prompts: the prefill runs one row per prompt
    and the K/V are copied to the run; greedy tokens equal a prefill of every row; a run that is not
    all equal falls back to every row."""
    model, tok = policy
    ids, mask = pad_left([p for p in PROMPTS for _ in range(3)], tok.pad_token_id, "cpu")
    widths = []
    embed = model.get_input_embeddings().register_forward_pre_hook(lambda _m, args: widths.append(args[0].shape))
    try:
        shared = decode.decode(model, ids, mask, 10, 0.0, 1.0, {10_000}, tok.pad_token_id, use_graph=False, group=3)
        prefill_rows = widths[0][0]
        widths.clear()
        mixed = ids.clone()
        mixed[1, -1] = 7   # row 1 is no longer its run's prompt
        decode.decode(model, mixed, mask, 2, 0.0, 1.0, {10_000}, tok.pad_token_id, use_graph=False, group=3)
    finally:
        embed.remove()
    assert prefill_rows == len(PROMPTS) and widths[0][0] == 3 * len(PROMPTS)
    alone = decode.decode(model, ids, mask, 10, 0.0, 1.0, {10_000}, tok.pad_token_id, use_graph=False)
    assert shared.tolist() == alone.tolist()


@pytest.mark.parametrize("top_p", [0.3, 0.75, 0.95])
def test_top_p_keeps_the_tokens_transformers_keeps(top_p):
    from transformers.generation.logits_process import TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(5, 50) * 3
    theirs = TopPLogitsWarper(top_p)(None, logits.clone()) > -float("inf")
    ours = decode.top_p_filter(torch.softmax(logits, -1), top_p) > 0
    assert torch.equal(ours, theirs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_the_captured_step_gives_the_eager_steps_tokens_on_cuda(policy):
    model, tok = policy
    model = model.cuda()
    ids, mask = pad_left(PROMPTS, tok.pad_token_id, "cuda")
    eager = decode.decode(model, ids, mask, 32, 0.0, 1.0, {10_000}, tok.pad_token_id, use_graph=False)
    lines = []
    graphed = decode.decode(model, ids, mask, 32, 0.0, 1.0, {10_000}, tok.pad_token_id, use_graph=True,
                            log=lines.append)
    model.cpu()
    assert torch.equal(eager, graphed)
    assert not any("failed" in line for line in lines), lines
