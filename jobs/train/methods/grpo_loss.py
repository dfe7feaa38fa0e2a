"""GRPO's maths on flat completion tokens: group advantages and the clipped policy-gradient loss.

Group advantages (Shao et al. 2024, DeepSeekMath, "GRPO"): each prompt's `num_generations`
completions are compared with each other, A_i = (r_i - mean(group)) / (std(group) + 1e-4); Dr. GRPO
(Liu et al. 2025, "Understanding R1-Zero-Like Training") drops the division by the std. A group whose
rewards are all equal has A = 0 for every completion, so it contributes no gradient.

Per token (TRL's `GRPOTrainer._compute_loss`, trl/trainer/grpo_trainer.py, with one update per
generation so the "old" policy is the current one detached):
    ratio = exp(logp - logp.detach())                    (1, with logp's gradient)
    l_t   = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) + beta * kl_t
    kl_t  = exp(ref - logp) - (ref - logp) - 1           (Schulman's k3 estimator, as TRL)
and the normalisation of the step (`loss_type`, TRL's names):
    grpo:    each completion's mean over its tokens, then the mean over completions
    dapo:    the mean over every completion token of the step (DAPO, Yu et al. 2025)
    dr_grpo: the sum over tokens / (completions x max_completion_length)
Written as sum_t w_t * l_t / count, with `count` over the whole accumulated (and data-parallel)
step as the loop's other methods do: w = 1 / len(completion) and count = completions (grpo),
w = 1 and count = tokens (dapo), w = 1 / max_completion_length and count = completions (dr_grpo)."""
from __future__ import annotations

import torch

STD_EPS = 1e-4   # TRL's: a group with tiny spread does not blow its advantages up


def group_advantages(rewards: torch.Tensor, group: int, scale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantage per completion [S], zero-variance flag per group [S / group]) for rewards [S]
    ordered group by group (prompt 0's completions first)."""
    grouped = rewards.float().view(-1, group)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True) if group > 1 else torch.zeros_like(centred[:, :1])
    flat = (grouped.max(dim=1).values - grouped.min(dim=1).values) == 0
    advantages = centred / (std + STD_EPS) if scale else centred
    advantages = torch.where(flat.unsqueeze(1), torch.zeros_like(advantages), advantages)
    return advantages.reshape(-1), flat


def token_weights(seq_index: torch.Tensor, lengths: torch.Tensor, loss_type: str,
                  max_completion_length: int) -> torch.Tensor:
    """w_t of the normalisation (module doc) for tokens of completions `seq_index` [N]."""
    if loss_type == "grpo":
        return 1.0 / lengths.float().clamp(min=1)[seq_index]
    if loss_type == "dapo":
        return torch.ones(seq_index.shape, dtype=torch.float32, device=seq_index.device)
    if loss_type == "dr_grpo":
        return torch.full(seq_index.shape, 1.0 / max_completion_length, dtype=torch.float32,
                          device=seq_index.device)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def units(lengths: list[int], loss_type: str) -> int:
    """What `count` counts for these completions: tokens for dapo, completions otherwise."""
    return sum(lengths) if loss_type == "dapo" else len(lengths)


def per_token_loss(logp: torch.Tensor, advantages: torch.Tensor, ref_logp: torch.Tensor | None,
                   beta: float, eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(l_t [N], kl_t [N] or None) for token log-probs `logp` [N] whose completions' advantages
    are `advantages` [N] (already gathered per token)."""
    ratio = torch.exp(logp - logp.detach())
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    loss = -torch.min(ratio * advantages, clipped * advantages)
    kl = None
    if beta > 0 and ref_logp is not None:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        loss = loss + beta * kl
    return loss, kl


def grpo_loss(logp: torch.Tensor, seq_index: torch.Tensor, lengths: torch.Tensor, advantages: torch.Tensor,
              count: torch.Tensor, *, ref_logp: torch.Tensor | None = None, beta: float = 0.0,
              eps_low: float = 0.2, eps_high: float = 0.2, loss_type: str = "dapo",
              max_completion_length: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss of these tokens / count, sum of kl_t * w_t or None): logp [N] of completion tokens,
    seq_index [N] their completion, lengths [S] tokens per completion, advantages [S]."""
    loss, kl = per_token_loss(logp, advantages.float()[seq_index], ref_logp, beta, eps_low, eps_high)
    weights = token_weights(seq_index, lengths, loss_type, max_completion_length)
    total = (loss * weights).sum() / count
    return total, (None if kl is None else (kl.detach() * weights).sum())
