"""Preference losses: the DPO family (with the reference-free SimPO, CPO, ORPO and the unpaired
KTO) and the Bradley-Terry reward-model loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .masked import masked_count, masked_sum

PAIRED_WITH_REFERENCE = ("sigmoid", "ipo", "hinge", "robust")
REFERENCE_FREE = ("simpo", "cpo", "orpo")
"""Losses of the policy's log-probs alone: no reference model is loaded or scored."""
UNPAIRED = ("kto",)
"""Losses of single completions labelled desirable or not (rows prompt/completion/label)."""
DPO_LOSS_TYPES = (*PAIRED_WITH_REFERENCE, *REFERENCE_FREE, *UNPAIRED)


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Sequence log-likelihood from token log-probs. (B, T), (B, T) -> (B,).

    reduction "sum" (log p(y|x), standard DPO) or "mean" (per-token average; 0 for empty rows).
    """
    return reduce_sequence(masked_sum(token_logps, mask, dim=-1), masked_count(token_logps, mask, dim=-1), reduction)


def reduce_sequence(sums: torch.Tensor, counts: torch.Tensor, reduction: str) -> torch.Tensor:
    """Summed log-probs (B,) and token counts (B,) -> the sum, or the token mean (0 for an empty row).

    The reference's log-probs are kept as sums (cached or live) and reduced here with the batch's
    counts, so the loss may read token means while the metrics read sums (as TRL logs them).
    """
    if reduction == "sum":
        return sums
    if reduction == "mean":
        ok = counts != 0
        return torch.where(ok, sums / torch.where(ok, counts, torch.ones_like(counts)), torch.zeros_like(sums))
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

    z = (pi_c - pi_r) - (ref_c - ref_r), eps = label_smoothing (the assumed flip rate):
    sigmoid: -(1 - eps) log sigma(beta z) - eps log sigma(-beta z)
             eps = 0: DPO; eps > 0: conservative DPO (cDPO, Mitchell 2023, https://ericmitchell.ai/cdpo.pdf),
             DPO against soft labels. TRL 1.16's `sigmoid` ignores label_smoothing.
    robust:  [-(1 - eps) log sigma(beta z) + eps log sigma(-beta z)] / (1 - 2 eps)
             rDPO (Chowdhury et al. 2024, https://arxiv.org/abs/2403.00409): an unbiased estimate of
             the clean-label DPO loss under flip rate eps < 1/2 (TRL's `robust`); eps = 0 is DPO.
    ipo:     (z - 1 / (2 beta))^2                                  (https://arxiv.org/abs/2310.12036)
    hinge:   relu(1 - beta z)                                      (SLiC)
    -> (mean loss, {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
    "rewards/margins"}) where the implicit rewards are beta * (pi - ref) of the inputs, batch means
    (the DPO trainer logs them on summed log-probs whatever dpo.reduction: `dpo_reward_metrics`).
    """
    z = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    eps = label_smoothing
    if loss_type == "sigmoid":
        losses = -(1 - eps) * F.logsigmoid(beta * z) - eps * F.logsigmoid(-beta * z)
    elif loss_type == "robust":
        losses = (-(1 - eps) * F.logsigmoid(beta * z) + eps * F.logsigmoid(-beta * z)) / (1 - 2 * eps)
    elif loss_type == "ipo":
        losses = (z - 1 / (2 * beta)) ** 2
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * z)
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; valid: {list(PAIRED_WITH_REFERENCE)}")
    return losses.mean(), dpo_reward_metrics(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)


def dpo_reward_metrics(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
                       ref_rejected: torch.Tensor, beta: float) -> dict[str, torch.Tensor]:
    """rewards/{chosen,rejected,accuracies,margins} of implicit rewards beta * (pi - ref), all (B,)
    inputs, as batch means (TRL's DPOTrainer logs these on summed log-probs)."""
    return _reward_metrics(beta * (policy_chosen - ref_chosen).detach(), beta * (policy_rejected - ref_rejected).detach())


def _reward_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Batch means of implicit rewards (B,), (B,) as DPO's metrics name them."""
    with torch.no_grad():
        return {"rewards/chosen": chosen.mean(), "rewards/rejected": rejected.mean(),
                "rewards/accuracies": (chosen > rejected).float().mean(), "rewards/margins": (chosen - rejected).mean()}


def reference_free_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    loss_type: str,
    beta: float,
    simpo_gamma: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Pair losses of the policy's sequence log-probs alone. (B,), (B,) -> (mean loss, metrics).

    d = pi_c - pi_r (sum or token-mean log-probs, as the caller reduced them);
    simpo: -log sigma(beta d - gamma), on token means     (Meng et al. 2024, arXiv:2405.14734)
    cpo:   -log sigma(beta d), on sums                     (Xu et al. 2024, arXiv:2401.08417)
    orpo:  -beta log sigma(log odds(y_c) - log odds(y_r)), odds(y) = p / (1 - p), p = exp(token
           mean)                                           (Hong et al. 2024, arXiv:2403.07691)
    CPO's and ORPO's NLL term on the chosen response is the caller's (dpo.nll_coef), as for RPO:
    the mean over pairs of each chosen response's token-mean NLL, response tokens only (ORPO's
    paper; TRL's ORPOTrainer averages over the chosen rows' prompt and response tokens). simpo
    with nll_coef 0 (the `simpo` preset) is the paper's SimPO; TRL's CPOTrainer with
    loss_type="simpo" keeps its default cpo_alpha=1.0, i.e. CPO-SimPO (nll_coef 1 here).
    Implicit rewards are beta * pi (no reference) on the reduced log-probs, as TRL's CPO and ORPO
    trainers log them (token means for simpo and orpo); orpo adds "log_odds_ratio" (mean log
    sigma of the log-odds gap) and "log_odds_chosen" (mean gap).
    """
    d = policy_chosen - policy_rejected
    metrics = _reward_metrics(beta * policy_chosen.detach(), beta * policy_rejected.detach())
    if loss_type == "simpo":
        losses = -F.logsigmoid(beta * d - simpo_gamma)
    elif loss_type == "cpo":
        losses = -F.logsigmoid(beta * d)
    elif loss_type == "orpo":
        # log(1 - p) = log(-expm1(log p)): exact for p close to 1, where 1 - exp would round to 0.
        log_odds = d - (torch.log(-torch.expm1(policy_chosen)) - torch.log(-torch.expm1(policy_rejected)))
        ratio = F.logsigmoid(log_odds)
        losses = -beta * ratio
        metrics["log_odds_ratio"] = ratio.detach().mean()
        metrics["log_odds_chosen"] = log_odds.detach().mean()
    else:
        raise ValueError(f"unknown reference-free loss_type {loss_type!r}; valid: {list(REFERENCE_FREE)}")
    return losses.mean(), metrics


def kto_reference_point(policy_logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0 from mismatched (prompt, completion) pairs. (N,), (N,) -> ().

    z0 = max(0, mean(pi - ref)): a batch estimate of KL(pi || ref), detached (no gradient flows
    through it, as in the paper and TRL). The caller builds the pairs as TRL does (prompt i with
    completion i - 1 of the batch, cyclically: `kto_mismatched_index`).
    """
    return (policy_logps - ref_logps).detach().mean().clamp(min=0)


def kto_mismatched_index(n: int) -> list[int]:
    """The completion paired with prompt i for KTO's z0: i - 1 (mod n), TRL's cycle of a batch's
    completions ([y_{n-1}, y_0, ..., y_{n-2}]). n >= 2, else the pair is the matched one."""
    return [(i - 1) % n for i in range(n)]


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    labels: torch.Tensor,
    kl: torch.Tensor,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KTO (Ethayarajh et al. 2024, arXiv:2402.01306) on unpaired completions.

    policy_logps, ref_logps (B,) summed sequence log-probs; labels (B,) bool (True: desirable); kl
    () the detached reference point z0 (kto_reference_point). With r = pi - ref:
    desirable:   w_D (1 - sigma(beta (r - z0)));   undesirable: w_U (1 - sigma(beta (z0 - r))).
    The weights are built in the log-probs' dtype (an fp64 run keeps w = 0.1 exact).
    -> (mean over the B completions, {"rewards/chosen", "rewards/rejected" (mean beta r over the
    desirable / undesirable completions, 0 where there are none), "rewards/margins",
    "logps/chosen", "logps/rejected" (mean pi over the same sets), "kl"}).
    """
    r = policy_logps - ref_logps
    labels = labels.bool()
    weights = torch.full_like(r, desirable_weight).masked_fill_(~labels, undesirable_weight)
    gap = torch.where(labels, r - kl, kl - r)
    losses = weights * (1 - torch.sigmoid(beta * gap))
    with torch.no_grad():
        n_d, n_u = labels.sum().clamp(min=1), (~labels).sum().clamp(min=1)
        chosen = (beta * r * labels).sum() / n_d
        rejected = (beta * r * ~labels).sum() / n_u
        metrics = {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margins": chosen - rejected,
                   "logps/chosen": (policy_logps * labels).sum() / n_d,
                   "logps/rejected": (policy_logps * ~labels).sum() / n_u, "kl": kl.detach()}
    return losses.mean(), metrics


def bradley_terry_loss(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model pairwise loss -log sigma(r_c - r_r). (B,), (B,) -> (mean loss, metrics)."""
    diff = chosen_rewards - rejected_rewards
    with torch.no_grad():
        metrics = {"accuracy": (diff > 0).float().mean(), "margin": diff.mean()}
    return -F.logsigmoid(diff).mean(), metrics
