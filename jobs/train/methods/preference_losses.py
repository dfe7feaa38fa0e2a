"""The preference losses, per unit (pair or KTO example), from sequence log-probs.

Inputs are per-unit tensors [P]: log-prob sums (`*_sum`) and answer token counts (`*_n`) of the
policy and (where used) the reference. Each function returns (loss per unit [P], chosen reward
[P], rejected reward [P]); the rewards are what TRL logs as rewards/chosen and rewards/rejected.

- DPO, sigmoid loss (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7; TRL
  DPOTrainer loss_type="sigmoid"): -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))) on
  summed log-probs; rewards beta * (pi - ref).
- ORPO (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without Reference Model",
  eq. 6-7; TRL ORPOTrainer.odds_ratio_loss): NLL of the chosen answer - lambda * log sigmoid(log
  odds(chosen) - log odds(rejected)), odds from length-normalised (mean) log-probs,
  log odds(p) = log p - log(1 - p). The NLL here is per pair (the chosen answer's mean token NLL),
  where TRL takes the token mean over the batch. Rewards: lambda * mean log-prob (TRL's).
- SimPO (Meng et al. 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward",
  eq. 6; TRL CPOTrainer loss_type="simpo"): -log sigmoid(beta * (mean_c - mean_r) - gamma).
  Rewards beta * mean log-prob (TRL's).
- KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization";
  TRL KTOTrainer.kto_loss): desirable: w_d * (1 - sigmoid(beta * (logratio - z0))), undesirable:
  w_u * (1 - sigmoid(beta * (z0 - logratio))), z0 the KL estimate: the mean over the batch's
  mismatched pairs of (pi - ref), clamped at 0 and detached (TRL's, without its gather across
  processes: here it is the micro-batch's).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def dpo_loss(pi_c, pi_r, ref_c, ref_r, beta: float):
    chosen, rejected = pi_c - ref_c, pi_r - ref_r
    loss = -F.logsigmoid(beta * (chosen - rejected))
    return loss, beta * chosen.detach(), beta * rejected.detach()


def _log_odds(mean_logp: torch.Tensor) -> torch.Tensor:
    # log(p / (1 - p)) with log p = mean_logp <= 0; log1p(-exp(x)) as in TRL (clamped off 0 so a
    # certain answer gives a large finite value, not inf)
    return mean_logp - torch.log1p(-torch.exp(mean_logp.clamp(max=-1e-6)))


def orpo_loss(mean_c, mean_r, lam: float):
    ratio = F.logsigmoid(_log_odds(mean_c) - _log_odds(mean_r))
    loss = -mean_c - lam * ratio
    return loss, lam * mean_c.detach(), lam * mean_r.detach()


def simpo_loss(mean_c, mean_r, beta: float, gamma: float):
    loss = -F.logsigmoid(beta * (mean_c - mean_r) - gamma)
    return loss, beta * mean_c.detach(), beta * mean_r.detach()


def kto_kl(pi_kl, ref_kl, valid):
    """The KL estimate z0: mean (pi - ref) over the valid mismatched sequences, >= 0, no grad."""
    n = valid.sum().clamp(min=1)
    return (((pi_kl - ref_kl) * valid).sum() / n).clamp(min=0).detach()


def kto_loss(pi, ref, desirable, kl, beta: float, w_desirable: float, w_undesirable: float):
    """desirable [P] in {0., 1.}; rewards: beta * (pi - ref) for desirable (chosen) and
    undesirable (rejected) units, 0 for the other kind."""
    logratio = pi - ref
    good = w_desirable * (1 - torch.sigmoid(beta * (logratio - kl)))
    bad = w_undesirable * (1 - torch.sigmoid(beta * (kl - logratio)))
    loss = desirable * good + (1 - desirable) * bad
    reward = beta * logratio.detach()
    return loss, reward * desirable, reward * (1 - desirable)
