"""Preference losses: DPO family and the Bradley-Terry reward-model loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .masked import masked_mean, masked_sum

DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge")


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Sequence log-likelihood from token log-probs. (B, T), (B, T) -> (B,).

    reduction "sum" (log p(y|x), standard DPO) or "mean" (per-token average; 0 for empty rows).
    """
    if reduction == "sum":
        return masked_sum(token_logps, mask, dim=-1)
    if reduction == "mean":
        return masked_mean(token_logps, mask, dim=-1)
    raise ValueError(f"unknown reduction {reduction!r}; valid: ['mean', 'sum']")


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO (https://arxiv.org/abs/2305.18290) and variants. All inputs (B,) sequence log-probs.

    z = (pi_c - pi_r) - (ref_c - ref_r).
    sigmoid: -(1 - ls) log sigma(beta z) - ls log sigma(-beta z)  (ls = label_smoothing, cDPO)
    ipo:     (z - 1 / (2 beta))^2                                  (https://arxiv.org/abs/2310.12036)
    hinge:   relu(1 - beta z)                                      (SLiC)
    -> (mean loss, {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
    "rewards/margins"}) where the implicit rewards are beta * (pi - ref), batch means.
    """
    z = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * z) - label_smoothing * F.logsigmoid(-beta * z)
    elif loss_type == "ipo":
        losses = (z - 1 / (2 * beta)) ** 2
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * z)
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; valid: {list(DPO_LOSS_TYPES)}")
    with torch.no_grad():
        chosen = beta * (policy_chosen - ref_chosen)
        rejected = beta * (policy_rejected - ref_rejected)
        metrics = {
            "rewards/chosen": chosen.mean(),
            "rewards/rejected": rejected.mean(),
            "rewards/accuracies": (chosen > rejected).float().mean(),
            "rewards/margins": (chosen - rejected).mean(),
        }
    return losses.mean(), metrics


def bradley_terry_loss(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model pairwise loss -log sigma(r_c - r_r). (B,), (B,) -> (mean loss, metrics)."""
    diff = chosen_rewards - rejected_rewards
    with torch.no_grad():
        metrics = {"accuracy": (diff > 0).float().mean(), "margin": diff.mean()}
    return -F.logsigmoid(diff).mean(), metrics
