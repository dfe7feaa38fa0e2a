"""GRPO's packed policy pass (grpo_data.rollout_tensors_packed: every prompt + completion of a
micro-batch in one row, position ids restarting, cu_seq_lens keeping documents apart), and its
pass with each prompt once (rollout_tensors_shared: a prompt and its group in one row under a 4-D
mask; rollout_tensors_packed_shared: packed, each completion's keys its prompt's then its own), give the loss, the KL and the LoRA gradients of the padded rows (fp32, relative 1e-5; the loss's value is
-sum(A w) / count at ratio 1 whatever the log-probs, so the KL and the gradients are what test the
log-probs; gradients to 5e-5 over each tensor: two attention paths), for each loss
normalisation, with and without the KL term; on the tiny Llama with a LoRA adapter, CPU."""
from types import SimpleNamespace

import pytest
import torch

from jobs.data import shared_prefix
from jobs.train.methods.grpo import GroupRelativePolicyOptimization, grpo_packing, grpo_prefix_sharing
from jobs.train.methods.grpo_data import (rollout_tensors, rollout_tensors_packed, rollout_tensors_packed_shared,
                                         rollout_tensors_shared, sharing_pays)

GROUP = 3
PROMPTS = [[5, 17, 33, 40, 2, 9, 81], [12, 7, 60]]
COMPLETIONS = [[8, 9, 10, 11, 12], [3], [40, 41, 42], [7, 7, 7, 7, 7, 7, 7], [100, 2], [55, 56, 57, 58]]
ADVANTAGES = torch.tensor([1.2, -0.3, -0.9, 0.5, -1.1, 0.6])


def _method(model, loss_type: str, beta: float, tokenizer=None):
    method = GroupRelativePolicyOptimization.__new__(GroupRelativePolicyOptimization)
    method.trainer = SimpleNamespace(model=model, tokenizer=tokenizer, log=lambda _line: None)
    method.spec = SimpleNamespace(temperature=0.9, beta=beta, epsilon=0.2, epsilon_high=0.0, loss_type=loss_type,
                                  max_completion_length=8, num_generations=GROUP,
                                  fused_kernels=True)   # the fused log-probs op (interpreted on CPU)
    return method


def _loss_and_grads(model, batch: dict, loss_type: str, beta: float):
    model.zero_grad(set_to_none=True)
    count = torch.tensor(float(sum(map(len, COMPLETIONS)) if loss_type == "dapo" else len(COMPLETIONS)))
    loss, kl = _method(model, loss_type, beta).loss(model, {**batch, "advantages": ADVANTAGES}, count)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), kl, grads


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_packed_completions_give_the_padded_loss_and_gradients(policy, loss_type, beta):  # noqa: F811
    from kernels.packed_attention import restore_attention, use_packed_attention

    model, tok = policy
    model.train()
    padded = rollout_tensors(PROMPTS, COMPLETIONS, GROUP, tok.pad_token_id)
    want, want_kl, want_grads = _loss_and_grads(model, padded, loss_type, beta)
    tensors, ints = rollout_tensors_packed(PROMPTS, COMPLETIONS, GROUP)
    assert tensors["input_ids"].shape == (1, sum(len(PROMPTS[s // GROUP]) + len(c) for s, c in enumerate(COMPLETIONS)))
    use_packed_attention(model)
    try:
        got, got_kl, got_grads = _loss_and_grads(model, {**tensors, **ints}, loss_type, beta)
    finally:
        restore_attention(model)
        model.eval()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    if beta:
        torch.testing.assert_close(got_kl, want_kl, rtol=1e-5, atol=1e-7)
    assert want_grads and set(got_grads) == set(want_grads)
    assert any(g.abs().sum() > 0 for g in want_grads.values())
    # relative over the tensor (elements near 0 differ by float noise); two attention paths in fp32 sum
    # in different orders: with the KL term 1.2e-5 was seen on an AMD EPYC CI machine (2026-12-03)
    for name, grad in want_grads.items():
        assert (got_grads[name] - grad).norm() <= 5e-5 * grad.norm(), name


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("packed", [False, True])
def test_each_prompt_once_gives_the_padded_loss_and_gradients(policy, beta, packed):  # noqa: F811
    """Padded (a 4-D mask) or packed (the varlen attention's keys gathered, kernels/packed_attention.py)."""
    from kernels.packed_attention import restore_attention, use_packed_attention

    model, tok = policy
    model.train()
    try:
        want, want_kl, want_grads = _loss_and_grads(model, rollout_tensors(PROMPTS, COMPLETIONS, GROUP, tok.pad_token_id),
                                                    "grpo", beta)
        if packed:
            tensors, ints = rollout_tensors_packed_shared(PROMPTS, COMPLETIONS, GROUP)
            real = tensors["input_ids"].numel()
            use_packed_attention(model)
            got, got_kl, got_grads = _loss_and_grads(model, {**tensors, **ints}, "grpo", beta)
        else:
            tensors, real = rollout_tensors_shared(PROMPTS, COMPLETIONS, GROUP, tok.pad_token_id)
            got, got_kl, got_grads = _loss_and_grads(model, tensors, "grpo", beta)
    finally:
        restore_attention(model)
        model.eval()
    assert tensors["input_ids"].shape[0] == (1 if packed else len(PROMPTS))   # each prompt once
    assert real == sum(map(len, PROMPTS)) + sum(map(len, COMPLETIONS))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    if beta:
        torch.testing.assert_close(got_kl, want_kl, rtol=1e-5, atol=1e-7)
    assert want_grads and set(got_grads) == set(want_grads)
    for name, grad in want_grads.items():
        assert (got_grads[name] - grad).norm() <= 5e-5 * grad.norm(), name


def test_a_shared_row_shows_each_completion_its_prompt_and_itself_only():
    tensors, real = rollout_tensors_shared([[1, 2, 3], [4]], [[9, 9], [8], [7, 7, 7], [6]], group=2, pad_id=0)
    assert tensors["input_ids"].tolist() == [[1, 2, 3, 9, 9, 8], [4, 7, 7, 7, 6, 0]] and real == 11
    assert tensors["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 1, 0]]
    assert tensors["gather"].tolist() == [2, 3, 2, 6, 7, 8, 6]   # the last prompt token predicts each first token
    mask = tensors["attention_mask"][:, 0].int().tolist()
    assert mask[0][5] == [1, 1, 1, 0, 0, 1]   # the second completion: its prompt and itself, not the first
    assert mask[0][4] == [1, 1, 1, 1, 1, 0] and mask[1][4] == [1, 0, 0, 0, 1, 0]
    assert mask[1][5] == [0, 0, 0, 0, 0, 1]   # padding sees itself only (no NaN row)


def test_a_prompt_is_shared_only_where_its_rows_cost_less():
    # the built-in task's shape (a ~60-token prompt, 4 completions of ~20) and a long one (8 of 2,000):
    # there one row of 16,200 positions costs ~3x the 8 rows of 2,200 in attention (SmolLM2-135M's h, f)
    assert sharing_pays([[1] * 60], [[2] * 20] * 4, 4, 576, 1536)
    assert not sharing_pays([[1] * 200], [[2] * 2000] * 8, 8, 576, 1536)


def test_the_packed_shared_row_gathers_each_completions_keys_behind_its_prompt():
    tensors, ints = rollout_tensors_packed_shared([[1, 2, 3], [4]], [[9, 9], [], [7, 7, 7], [6]], group=2)
    assert tensors["input_ids"].tolist() == [[1, 2, 3, 9, 9, 4, 7, 7, 7, 6]]
    assert tensors["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 1]
    assert tensors["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 9, 10]   # the empty completion has no document
    assert tensors["kv_index"].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 5, 9]
    assert tensors["cu_seq_lens_k"].tolist() == [0, 3, 8, 9, 13, 15]
    assert tensors["gather"].tolist() == [2, 3, 5, 6, 7, 5]   # the last prompt token predicts each first token
    assert tensors["lengths"].tolist() == [2, 0, 3, 1] and ints == {"max_length_q": 3, "max_length_k": 5}


def test_prompts_are_shared_on_packed_passes_and_padded_sdpa_passes_off_the_gpu():
    sdpa = SimpleNamespace(_attn_implementation="sdpa")
    assert grpo_prefix_sharing(False, "cpu", sdpa)[0] and grpo_prefix_sharing(True, "cuda", sdpa)[0]
    assert not grpo_prefix_sharing(False, "cuda", sdpa)[0]
    refused = grpo_prefix_sharing(True, "cuda", sdpa, "the varlen kernel's causality is not aligned bottom right")
    assert not refused[0] and "bottom right" in refused[1]
    eager, sliding = SimpleNamespace(_attn_implementation="eager"), SimpleNamespace(
        _attn_implementation="sdpa", layer_types=["full_attention", "sliding_attention"])
    assert "eager" in grpo_prefix_sharing(False, "cpu", eager)[1]
    assert "sliding" in grpo_prefix_sharing(False, "cpu", sliding)[1]


def test_the_packed_row_restarts_positions_and_bounds_each_sequence():
    tensors, ints = rollout_tensors_packed([[1, 2, 3], [4]], [[9, 9], [8], [7, 7, 7], [6]], group=2)
    assert tensors["cu_seq_lens_q"].tolist() == [0, 5, 9, 13, 15]
    assert tensors["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert tensors["gather"].tolist() == [2, 3, 7, 9, 10, 11, 13]   # the positions that predict each token
    assert ints == {"max_length_q": 5, "max_length_k": 5}


def test_packing_auto_packs_on_the_gpu_only():
    plain, capped = SimpleNamespace(), SimpleNamespace(attn_logit_softcapping=50.0)
    assert grpo_packing("auto", "cuda", plain)[0] and not grpo_packing("auto", "cpu", plain)[0]
    assert not grpo_packing("auto", "cuda", capped)[0] and grpo_packing("on", "cpu", plain)[0]
    assert not grpo_packing("off", "cuda", plain)[0]


@pytest.mark.parametrize("layout", ["padded", "shared", "packed", "packed shared"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_a_micro_batch_trained_in_passes_gives_the_whole_ones_loss_and_gradients(policy, loss_type, layout):  # noqa: F811
    """Within max_gpu_memory_gb a sampled micro-batch may train in passes of a few completions
    (jobs/models/fit.py grpo_policy_rows): the step's count covers every completion, so the passes'
    losses and gradients add up to the whole's (a pass of 4 and one of 2 here, with the KL term)."""
    from jobs.train.methods.grpo_data import RolloutBatch
    from kernels.packed_attention import restore_attention, use_packed_attention

    model, tok = policy
    model.train()
    method = _method(model, loss_type, 0.05, tok)
    method.packed = layout.startswith("packed")
    method.shared = shared_prefix.model_size(model.config) if "shared" in layout else None   # a pass splits a group
    count = torch.tensor(float(sum(map(len, COMPLETIONS)) if loss_type == "dapo" else len(COMPLETIONS)))

    def run(policy_rows):
        method.policy_rows = policy_rows
        pieces = method._policy_batches(RolloutBatch(rows=[]), PROMPTS, COMPLETIONS, ADVANTAGES)
        model.zero_grad(set_to_none=True)
        total = 0.0
        for piece in pieces:
            loss, _ = method.loss(model, piece.to("cpu"), count)
            loss.backward()
            total += loss.detach()
        units = sum(piece.label_tokens for piece in pieces)
        return len(pieces), total, units, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    if method.packed:
        use_packed_attention(model)
    try:
        whole, passes = run(None), run(4)
    finally:
        restore_attention(model)
        model.eval()
    assert (whole[0], passes[0]) == (1, 2) and whole[2] == passes[2] == count.item()
    torch.testing.assert_close(passes[1], whole[1], rtol=1e-5, atol=1e-7)
    for name, grad in whole[3].items():
        assert (passes[3][name] - grad).norm() <= 1e-5 * grad.norm(), name
