"""GRPO's loss and gradient (jobs/train/methods/grpo_loss.py on the fused log-probs op) against a
plain PyTorch reference written the way TRL's GRPOTrainer computes it: full [S, T, V] logits,
log_softmax, a completion mask, and each loss_type's normalisation; fp32 at odd shapes."""
import pytest
import torch

from jobs.train.methods import grpo_loss
from kernels.ops.fused_linear_logprobs import fused_linear_logprobs

S, T, D, V, G = 6, 7, 24, 37, 3   # 2 groups of 3 completions, up to 7 tokens, odd sizes


def reference_loss(hidden, weight, tokens, mask, advantages, ref_hidden, beta, eps_low, eps_high, loss_type,
                   temperature, max_len):
    logits = (hidden @ weight.T).float() / temperature                   # [S, T, V]
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.unsqueeze(1)
    loss = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)
    if beta > 0:
        ref = torch.log_softmax((ref_hidden @ weight.T).float() / temperature, -1)
        ref = ref.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        loss = loss + beta * (torch.exp(ref - logp) - (ref - logp) - 1)
    m = mask.float()
    if loss_type == "grpo":
        return ((loss * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()
    if loss_type == "dapo":
        return (loss * m).sum() / m.sum().clamp(min=1)
    return (loss * m).sum() / (loss.size(0) * max_len)


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(S, T, D, generator=g)
    ref_hidden = hidden + 0.3 * torch.randn(S, T, D, generator=g)
    weight = torch.randn(V, D, generator=g) * 0.3
    tokens = torch.randint(0, V, (S, T), generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.randn(S, generator=g)
    return hidden, ref_hidden, weight, tokens, lengths, mask, rewards


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_loss_and_gradient_match_the_full_logits_reference(loss_type, beta):
    hidden, ref_hidden, weight, tokens, lengths, mask, rewards = inputs()
    advantages, _ = grpo_loss.group_advantages(rewards, G, scale=loss_type != "dr_grpo")
    temperature, max_len = 0.7, 9

    h_ref = hidden.clone().requires_grad_(True)
    expected = reference_loss(h_ref, weight, tokens, mask, advantages, ref_hidden, beta, 0.2, 0.28, loss_type,
                              temperature, max_len)
    expected.backward()

    h = hidden.clone().requires_grad_(True)
    flat_h, flat_ref, labels = h[mask], ref_hidden[mask], tokens[mask]
    seq_index = torch.arange(S).unsqueeze(1).expand(S, T)[mask]
    logp = fused_linear_logprobs(flat_h, weight, labels, temperature=temperature)
    ref = fused_linear_logprobs(flat_ref, weight, labels, temperature=temperature) if beta else None
    count = torch.tensor(float(grpo_loss.units(lengths.tolist(), loss_type)))
    got, kl = grpo_loss.grpo_loss(logp, seq_index, lengths, advantages, count, ref_logp=ref, beta=beta,
                                  eps_low=0.2, eps_high=0.28, loss_type=loss_type, max_completion_length=max_len)
    got.backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-5, atol=1e-7)
    assert h.grad.abs().sum() > 0
    assert (kl is None) == (beta == 0)


def test_a_group_with_equal_rewards_contributes_no_gradient():
    hidden, _, weight, tokens, lengths, mask, rewards = inputs(1)
    rewards[:G] = 0.5                                  # group 0: every completion scored the same
    advantages, flat = grpo_loss.group_advantages(rewards, G)
    assert flat.tolist() == [True, False] and advantages[:G].abs().sum() == 0
    h = hidden.clone().requires_grad_(True)
    seq_index = torch.arange(S).unsqueeze(1).expand(S, T)[mask]
    logp = fused_linear_logprobs(h[mask], weight, tokens[mask])
    loss, _ = grpo_loss.grpo_loss(logp, seq_index, lengths, advantages, torch.tensor(6.0), loss_type="grpo")
    loss.backward()
    assert h.grad[:G].abs().max() == 0                 # group 0's hidden states get nothing
    assert h.grad[G:].abs().max() > 0


def test_advantages_are_centred_and_scaled_per_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0, 6.0])
    scaled, _ = grpo_loss.group_advantages(rewards, 3)
    plain, _ = grpo_loss.group_advantages(rewards, 3, scale=False)
    torch.testing.assert_close(plain, torch.tensor([2 / 3, -1 / 3, -1 / 3, -2.0, 0.0, 2.0]))
    torch.testing.assert_close(scaled[3:], torch.tensor([-2.0, 0.0, 2.0]) / (2.0 + grpo_loss.STD_EPS))


def test_the_prompt_plan_gives_a_checkpoint_its_data_order():
    """A GRPO job's plan is fingerprinted like any other (a checkpoint's data order, rng_state.py)."""
    from jobs.train.methods.grpo_data import PromptPlan
    from jobs.train.rng_state import data_order_digest
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(7)]
    plan = PromptPlan(rows, batch_size=2, seed=3)
    assert sorted(i for batch in plan.epoch_batches(0) for i in batch) == list(range(7))
    assert data_order_digest(plan) == data_order_digest(PromptPlan(rows, batch_size=2, seed=3))
    assert data_order_digest(plan) != data_order_digest(PromptPlan(rows[:-1], batch_size=2, seed=3))
