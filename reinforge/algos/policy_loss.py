"""Policy-gradient surrogate losses. One signature, one registry.

Every loss is::

    fn(log_probs, old_log_probs, advantages, response_mask, *, **hyper) -> (loss_mat (B, T), metrics)

where ``hyper`` are exactly the fields of the params dataclass the loss is registered with
(``POLICY_LOSSES``, an ``algos.registry.Registry``; the registry checks the signature against
the dataclass, so no loss accepts a setting it ignores). Each field is also the ``actor.<name>``
config key, with its default, range and description; clip_cov also takes the runtime keyword
``generator`` (its seeded draw). ``POLICY_LOSSES.entry(name).kwargs(actor_cfg, generator=g)``
builds one call's keywords.

log_probs (B, T) carry the gradient; old_log_probs, advantages (B, T) are constants. The
loss matrix is per token (0 outside the mask); reduce it with ``aggregation.agg_loss``.
Metric tensors (scalars, detached), all masked means over valid tokens:

- ``pg_clipfrac``: tokens whose surrogate is clipped at the trust-region bound that binds for
  their advantage sign (ratio > 1 + clip_high with A > 0, or ratio < 1 - clip_low with A < 0);
  the same definition as veRL's, so runs compare.
- ``pg_clipfrac_lower``: tokens where the dual clip binds (A < 0 and ratio > clip_c); for
  losses without a dual clip, tokens whose IS weight is clipped at the lower bound.
- ``ppo_kl``: mean of old_log_probs - log_probs (k1 estimate of KL(old || new)), from the raw
  log-ratio in every loss: veRL 0.9 reports the mean of the +-20-clamped log-ratio in vanilla
  (ppo_clip), cispo, sapo and dppo_*, which hides a token that moved further; here the metric is
  the true k1 mean whatever the loss clamps (and ``log_ratio_max`` reports the extreme token).

The log-ratio log r = log pi - log pi_old, per loss (decided by what its formula needs):

- ``ppo_clip``, ``vanilla``, ``cispo``, ``sapo``, ``dppo_tv``, ``dppo_kl``: clamped to +-20
  (``_log_ratio``), veRL's bound in the same losses. Their ratio r = exp(log r) then stays below
  e^20 ~ 4.9e8, and a token beyond the bound gets no gradient through r.
- ``gspo``: the sequence log-ratio is the mean of the +-20-clamped token log-ratios; its gradient
  flows through log pi at every token whatever the ratio (GSPO-token form).
- ``clip_cov``, ``kl_cov``, ``gmpo``: the raw log-ratio, as veRL. It is clamped only above
  ``_exp_bound`` (88 in fp32 and bf16, 11 in fp16, 709 in fp64), where exp() would overflow to inf
  and the loss and its gradient would be inf / NaN; so below that the loss and its gradient are
  veRL's (a clamp at 20 would zero the gradient of kl_cov's penalty and of clip_cov's unclipped
  negative-advantage tokens exactly where they matter most).
- ``dro``: the raw log-ratio, unclamped: its penalty (beta / 2)(log r)^2 is a polynomial, with no
  overflow to guard, and its gradient beta * log r must pull back a token however far it moved.
- ``reinforce`` / ``gpg``: no ratio at all.

``log_ratio_max`` (the actor's ``actor/log_ratio_max``) is max |log pi - log pi_old| over the valid
tokens: a ratio of e^20 is a signal to report, not to hide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .kl import LOG_RATIO_CLAMP  # veRL's +-20 bound on |log ratio| (its ratio losses and the k3 KL)
from .masked import _zero_outside, masked_mean
from .registry import Registry, param


# --------------------------------------------------------------------------- hyper-parameters


@dataclass
class ClipParams:
    clip_low: float = param(0.2, "[0, 1)", "Lower clip range: ratio >= 1 - clip_low.")
    clip_high: float = param(0.2, "[0, inf)", "Upper clip range: ratio <= 1 + clip_high (DAPO clip-higher: 0.28).")


@dataclass
class DualClipParams(ClipParams):
    clip_c: Optional[float] = param(None, "(1, inf)", "Dual-clip constant (> 1) bounding the loss for negative "
                                                      "advantages (dppo_*: the IS-ratio cap, 20 when None); "
                                                      "None disables.")


@dataclass
class SapoParams:
    tau_pos: float = param(1.0, "(0, inf)", "sapo: gate temperature for tokens with A > 0 (veRL's default).")
    tau_neg: float = param(1.05, "(0, inf)", "sapo: gate temperature for tokens with A <= 0 (veRL's default).")


@dataclass
class ClipCovParams(ClipParams):
    clip_cov_ratio: float = param(0.0002, "(0, 1]", "clip_cov: fraction of valid tokens whose gradient is removed "
                                                    "(at least one).")
    clip_cov_lb: float = param(1.0, "(-inf, inf)", "clip_cov: only tokens with covariance above this are candidates.")
    clip_cov_ub: float = param(5.0, "(-inf, inf)", "clip_cov: only tokens with covariance below this are candidates.")


def _check_clip_cov(p: ClipCovParams) -> None:
    if not p.clip_cov_lb < p.clip_cov_ub:
        raise ValueError(f"clip_cov_lb={p.clip_cov_lb} must be below clip_cov_ub={p.clip_cov_ub} "
                         "(clip_cov's covariance window)")


@dataclass
class KLCovParams:
    kl_cov_ratio: float = param(0.0002, "(0, 1]", "kl_cov: fraction of valid tokens (largest covariance, at least "
                                                  "one) given the KL penalty.")
    ppo_kl_coef: float = param(0.1, "[0, inf)", "kl_cov: weight of the |log ratio| penalty on the selected tokens.")


@dataclass
class DroParams:
    dro_beta: float = param(0.05, "[0, inf)", "dro: weight of the quadratic log-ratio penalty, "
                                              "(dro_beta / 2) (log pi - log pi_old)^2.")


# --------------------------------------------------------------------------- losses


def _log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_old clamped to +-20: veRL's bound in its ratio losses (module docstring)."""
    return (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _exp_bound(dtype: torch.dtype) -> float:
    """The largest integer x whose exp(x) is finite in ``dtype``: 88 (fp32, bf16), 11 (fp16), 709 (fp64)."""
    return float(math.floor(math.log(torch.finfo(dtype).max)))


def _raw_log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_old, clamped only from above at ``_exp_bound`` (where exp() would give inf;
    below, exp() underflows harmlessly to 0). (B, T) -> (B, T)."""
    lr = log_probs - old_log_probs
    return lr.clamp(max=_exp_bound(lr.dtype))


def log_ratio_max(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max |log pi - log pi_old| over the valid tokens (0 for an empty mask; NaN if a valid token's
    is NaN), detached. (B, T) x 3 -> scalar. The actor's ``actor/log_ratio_max`` (reduced by max)."""
    with torch.no_grad():
        d = (log_probs - old_log_probs).abs()
        d = torch.where(mask > 0, d, torch.zeros((), dtype=d.dtype, device=d.device))
        return d.amax() if d.numel() else d.new_zeros(())


def _metrics(log_probs, old_log_probs, mask, clipped, clipped_lower) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {
            "pg_clipfrac": masked_mean(clipped.float(), mask),
            "pg_clipfrac_lower": masked_mean(clipped_lower.float(), mask),
            "ppo_kl": masked_mean((old_log_probs - log_probs).float(), mask),
        }


def _unclipped_metrics(log_probs, old_log_probs, mask) -> dict[str, torch.Tensor]:
    """`_metrics` of a loss that clips no token (both clip fractions 0)."""
    none = torch.zeros_like(log_probs, dtype=torch.bool)
    return _metrics(log_probs, old_log_probs, mask, none, none)


def _clipped_surrogate(ratio, advantages, clip_low, clip_high):
    """PPO's max(-A r, -A clip(r)). -> (loss (B, T), clipped-bound-active (B, T) bool)."""
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(loss1, loss2), loss2 > loss1


def _dual_clip(loss, advantages, clip_c):
    """Bound negative-advantage losses by -A * clip_c. -> (loss, dual-clip-active bool)."""
    if clip_c is None:
        return loss, torch.zeros_like(loss, dtype=torch.bool)
    if clip_c <= 1.0:
        raise ValueError(f"dual-clip constant clip_c must be > 1, got {clip_c}")
    loss3 = -advantages * clip_c
    dual = (advantages < 0) & (loss > loss3)
    return torch.where(dual, loss3, loss), dual


def ppo_clip(log_probs, old_log_probs, advantages, response_mask, *, clip_low=0.2, clip_high=0.2, clip_c=None):
    """PPO clipped surrogate (https://arxiv.org/abs/1707.06347) with asymmetric bounds.

    clip_high > clip_low is DAPO's clip-higher (https://arxiv.org/abs/2503.14476). With
    clip_c (> 1), negative-advantage tokens are further bounded by -A * clip_c (dual clip,
    https://arxiv.org/abs/1912.09729). Clipped tokens get zero gradient.
    """
    ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
    loss, clipped = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    loss, dual = _dual_clip(loss, advantages, clip_c)
    metrics = _metrics(log_probs, old_log_probs, response_mask, clipped & ~dual, dual)
    return _zero_outside(loss, response_mask), metrics


def gspo(log_probs, old_log_probs, advantages, response_mask, *, clip_low=0.2, clip_high=0.2, clip_c=None):
    """GSPO (https://arxiv.org/abs/2507.18071): sequence-level importance ratio.

    s_i = exp(mean over valid tokens of log(pi / pi_old)); per token
    s_i,t = sg(s_i) * exp(logp_t - sg(logp_t)), which has value s_i and lets each token's
    gradient flow (GSPO-token form). The PPO clip uses [1 - clip_low, 1 + clip_high] on s_i
    (the paper uses ~3e-4 / 4e-4). clip_c: dual clip as in ppo_clip.
    """
    lr = _log_ratio(log_probs, old_log_probs)
    seq_lr = masked_mean(lr, response_mask, dim=-1).detach()  # (B,)
    tok_lr = seq_lr.unsqueeze(-1) + log_probs - log_probs.detach()  # (B, T), value = seq_lr
    ratio = torch.exp(tok_lr)  # seq_lr is a mean of clamped log-ratios: already within +-20
    loss, clipped = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    loss, dual = _dual_clip(loss, advantages, clip_c)
    metrics = _metrics(log_probs, old_log_probs, response_mask, clipped & ~dual, dual)
    return _zero_outside(loss, response_mask), metrics


def cispo(log_probs, old_log_probs, advantages, response_mask, *, clip_low=0.2, clip_high=0.2):
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clipped IS weight times log-prob.

    loss = -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * log pi. Every token keeps a
    gradient (only the weight is clipped). The paper effectively disables the lower bound:
    pass clip_low >= 1 for that. No dual clip (there is no surrogate to bound).
    pg_clipfrac: weight clipped at the upper bound; pg_clipfrac_lower: at the lower bound.
    """
    ratio = torch.exp(_log_ratio(log_probs, old_log_probs)).detach()
    weight = ratio.clamp(max(1.0 - clip_low, 0.0), 1.0 + clip_high)
    loss = -advantages * weight * log_probs
    upper, lower = ratio > 1.0 + clip_high, ratio < 1.0 - clip_low
    metrics = _metrics(log_probs, old_log_probs, response_mask, upper, lower)
    return _zero_outside(loss, response_mask), metrics


def gmpo(log_probs, old_log_probs, advantages, response_mask, *, clip_low=0.2, clip_high=0.2):
    """GMPO (https://arxiv.org/abs/2507.20673): geometric mean of token ratios per sequence.

    Token log-ratios are clipped in log space to [-clip_low, clip_high] on the side that
    binds for the advantage sign (the PPO min, taken in log space); the sequence ratio is
    exp(mean over valid tokens of the clipped log-ratios); loss_t = -A_t * seq_ratio. Note the
    bounds are log-space: the paper uses 0.4 (ratio in [e^-0.4, e^0.4]), so pass
    clip_low=clip_high=0.4 explicitly. No dual clip.
    Use seq-mean-token-mean aggregation to recover the paper's per-sequence mean.
    The token log-ratios are raw, as veRL's ``geo_mean`` (clamped only where exp() would overflow:
    ``_raw_log_ratio``), so the side the clip leaves open keeps its gradient beyond |log r| = 20.
    """
    lr = _raw_log_ratio(log_probs, old_log_probs)
    sgn = torch.sign(advantages)
    clipped_lr = lr.clamp(-clip_low, clip_high)
    lr_min = sgn * torch.minimum(sgn * lr, sgn * clipped_lr)  # zero grad where the clip binds
    seq_ratio = torch.exp(masked_mean(lr_min, response_mask, dim=-1))  # (B,)
    loss = -advantages * seq_ratio.unsqueeze(-1)
    upper = (advantages > 0) & (lr > clip_high)
    lower = (advantages < 0) & (lr < -clip_low)
    metrics = _metrics(log_probs, old_log_probs, response_mask, upper | lower, lower)
    return _zero_outside(loss, response_mask), metrics


def vanilla(log_probs, old_log_probs, advantages, response_mask):
    """Plain policy gradient -A * r with r = pi / pi_old, no clipping.

    On-policy (r = 1) its gradient is -A * grad log pi, the REINFORCE gradient.
    """
    ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
    loss = -advantages * ratio
    metrics = _unclipped_metrics(log_probs, old_log_probs, response_mask)
    return _zero_outside(loss, response_mask), metrics


def reinforce(log_probs, old_log_probs, advantages, response_mask):
    """REINFORCE surrogate -A * log pi, no ratio and no clip.

    Its gradient is -A * grad log pi at any weights, not only on-policy (unlike ``vanilla``'s
    -A * r, whose gradient is -A * r * grad log pi). veRL's ``reinforce`` loss without its
    rollout IS weights; ``gpg`` is the same surrogate (GPG, https://arxiv.org/abs/2504.02546,
    pairs it with its own advantage estimator).
    """
    loss = -advantages * log_probs
    metrics = _unclipped_metrics(log_probs, old_log_probs, response_mask)
    return _zero_outside(loss, response_mask), metrics


def sapo(log_probs, old_log_probs, advantages, response_mask, *, tau_pos=1.0, tau_neg=1.05):
    """SAPO (https://arxiv.org/abs/2511.20347): a soft gate on the ratio instead of a hard clip.

    loss = -A * f(r), f(r) = (4 / tau) * sigmoid(tau * (r - 1)), tau = tau_pos where A > 0 else
    tau_neg (veRL's defaults 1.0 / 1.05). f(1) = 2 / tau and f'(1) = 1, so on-policy the gradient
    is the plain policy gradient; away from r = 1 the gradient f'(r) = 4 s (1 - s) decays
    smoothly instead of dropping to zero at a bound. Both clip fractions are 0 (as in veRL). The paper aggregates with seq-mean-token-mean (veRL forces it; here
    actor.loss_agg_mode decides).
    """
    ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
    tau = torch.full_like(ratio, tau_neg).masked_fill(advantages > 0, tau_pos)  # ratio's dtype and device
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    metrics = _unclipped_metrics(log_probs, old_log_probs, response_mask)
    return _zero_outside(-advantages * gate, response_mask), metrics


def _rank_desc(scores: torch.Tensor) -> torch.Tensor:
    """Rank of each entry in descending order of scores (0 = largest). (B, T) -> (B, T) long."""
    order = scores.flatten().argsort(descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return rank.view_as(scores)


def _token_cov(log_probs, advantages, mask):
    """Per-token centred product (A - mean A) * (logp - mean logp) over valid tokens, detached.

    The covariance of log-prob and advantage that Cui et al. (https://arxiv.org/abs/2505.22617)
    show drives entropy collapse; means are over this batch's valid tokens. -> (B, T).
    """
    lp = log_probs.detach()
    return (advantages - masked_mean(advantages, mask)) * (lp - masked_mean(lp, mask))


def _top_count(ratio: float, mask: torch.Tensor) -> torch.Tensor:
    """max(floor(ratio * valid tokens), 1) as a tensor (no host sync)."""
    return torch.clamp(torch.floor(ratio * mask.float().sum()), min=1.0)


def clip_cov(log_probs, old_log_probs, advantages, response_mask, *, clip_low=0.2, clip_high=0.2,
             clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, generator=None):
    """Clip-Cov (Cui et al., https://arxiv.org/abs/2505.22617): PPO clip, plus detaching a few
    high-covariance tokens.

    Among valid tokens that the PPO clip does not already bind and whose covariance
    (``_token_cov``) lies in (clip_cov_lb, clip_cov_ub), max(floor(clip_cov_ratio * valid), 1)
    are drawn uniformly at random (``generator`` seeds the draw) and their loss is set to 0, so
    they give no gradient. pg_clipfrac: the fraction of tokens so removed (veRL's definition);
    pg_clipfrac_lower: 0. No dual clip (as in veRL). Defaults are veRL's.
    The ratio is exp of the raw log-ratio, as veRL's (clamped only where exp() would overflow:
    ``_raw_log_ratio``): a negative-advantage token far above the bound is not clipped, and keeps
    its gradient -A r grad log pi beyond |log r| = 20.
    """
    ratio = torch.exp(_raw_log_ratio(log_probs, old_log_probs))
    loss, clipped = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    cov = _token_cov(log_probs, advantages, response_mask)
    valid = response_mask > 0
    cand = valid & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    keys = torch.rand(cov.shape, generator=generator, device="cpu").to(cov.device)
    keys = torch.where(cand, keys, torch.full_like(keys, -1.0))
    drop = cand & (_rank_desc(keys) < _top_count(clip_cov_ratio, response_mask))
    loss = torch.where(drop, torch.zeros_like(loss), loss)
    metrics = _metrics(log_probs, old_log_probs, response_mask, drop, torch.zeros_like(drop))
    return _zero_outside(loss, response_mask), metrics


def kl_cov(log_probs, old_log_probs, advantages, response_mask, *, kl_cov_ratio=0.0002, ppo_kl_coef=0.1):
    """KL-Cov (Cui et al., https://arxiv.org/abs/2505.22617): unclipped -A * r, plus a KL penalty
    on the highest-covariance tokens.

    The max(floor(kl_cov_ratio * valid), 1) valid tokens with the largest covariance
    (``_token_cov``) get loss -A * r + ppo_kl_coef * |log r|; the others -A * r. There is no
    ratio clip. pg_clipfrac: the fraction of penalised tokens (veRL reports
    none); ppo_kl stays the k1 mean like every loss here (veRL's kl_cov logs mean |log r|).
    Defaults are veRL's config defaults. The penalty reads the raw log-ratio (its gradient
    ppo_kl_coef * sign(log r) survives at any distance) and r is exp of the raw log-ratio, clamped
    only where exp() would overflow (``_raw_log_ratio``), as veRL's.
    """
    lr = log_probs - old_log_probs
    loss = -advantages * torch.exp(_raw_log_ratio(log_probs, old_log_probs))
    valid = response_mask > 0
    cov = torch.where(valid, _token_cov(log_probs, advantages, response_mask), torch.full_like(lr, -torch.inf))
    picked = valid & (_rank_desc(cov) < _top_count(kl_cov_ratio, response_mask))
    loss = torch.where(picked, loss + ppo_kl_coef * lr.abs(), loss)
    metrics = _metrics(log_probs, old_log_probs, response_mask, picked, torch.zeros_like(picked))
    return _zero_outside(loss, response_mask), metrics


def _dppo(log_probs, old_log_probs, advantages, response_mask, too_far_up, too_far_down, clip_c):
    """DPPO's shared surrogate: -A * sg(min(r, cap)) * log pi on tokens the trust region keeps.

    too_far_up / too_far_down (B, T) bool: the new policy moved too far up (blocks A > 0 tokens)
    or down (blocks A < 0 tokens). cap = clip_c, or 20 when None (veRL's fallback). The gradient
    of a kept token is -A * min(r, cap) * grad log pi (PPO's unclipped gradient, IS-capped).
    """
    lr = _log_ratio(log_probs, old_log_probs)
    cap = 20.0 if clip_c is None else clip_c
    weight = torch.exp(lr).detach().clamp(max=cap)
    keep = torch.where(advantages > 0, ~too_far_up, ~too_far_down)
    loss = torch.where(keep, -advantages * weight * log_probs, torch.zeros_like(log_probs))
    metrics = _metrics(log_probs, old_log_probs, response_mask, ~keep, keep & (torch.exp(lr) > cap))
    return _zero_outside(loss, response_mask), metrics


def dppo_tv(log_probs, old_log_probs, advantages, response_mask, *, clip_low=0.2, clip_high=0.2, clip_c=None):
    """DPPO, total-variation trust region (https://arxiv.org/abs/2602.04879, veRL ``dppo_tv``).

    A token is dropped (loss 0) when its probability moved beyond the bound in the direction its
    advantage pushes: p - p_old > clip_high with A > 0, or p - p_old < -clip_low with A <= 0
    (bounds on probabilities, not ratios). Kept tokens: -A * sg(min(r, cap)) * log pi (``_dppo``).
    pg_clipfrac: dropped tokens; pg_clipfrac_lower: kept tokens whose ratio exceeds the cap.
    """
    with torch.no_grad():
        diff = torch.exp(log_probs) - torch.exp(old_log_probs)
    return _dppo(log_probs, old_log_probs, advantages, response_mask, diff > clip_high, diff < -clip_low, clip_c)


def dppo_kl(log_probs, old_log_probs, advantages, response_mask, *, clip_low=0.2, clip_high=0.2, clip_c=None):
    """DPPO, binary-KL trust region (https://arxiv.org/abs/2602.04879, veRL ``dppo_kl``).

    The divergence is the KL between the Bernoulli distributions (p_old, 1 - p_old) and (p, 1 - p)
    of the sampled token: p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)) (1e-8 added
    inside the second log, as veRL). A token is dropped when that KL exceeds clip_high and p rose
    (A > 0), or exceeds clip_low and p fell (A <= 0). Otherwise as ``dppo_tv``.
    """
    with torch.no_grad():
        p, p_old = torch.exp(log_probs), torch.exp(old_log_probs)
        bkl = p_old * (old_log_probs - log_probs) + (1 - p_old) * (torch.log(1 - p_old + 1e-8) - torch.log(1 - p + 1e-8))
    return _dppo(log_probs, old_log_probs, advantages, response_mask,
                 (bkl > clip_high) & (p > p_old), (bkl > clip_low) & (p < p_old), clip_c)


def dro(log_probs, old_log_probs, advantages, response_mask, *, dro_beta=0.05):
    """DRO-style loss (Direct Reward Optimization, https://arxiv.org/abs/2405.19107; veRL 0.9's
    ``compute_policy_loss_dro``): -(A * log pi - (dro_beta / 2) * (log pi - log pi_old)^2).

    The REINFORCE term plus a quadratic penalty on the log-ratio, which replaces the clip as
    the trust region: the gradient is (-A + dro_beta * log r) * grad log pi. The penalty applies
    at every valid token, whatever its advantage. No token is clipped. The log-ratio is not
    clamped (a polynomial has no overflow to guard): however far a token moved, its penalty is
    the true (dro_beta / 2)(log r)^2 and its gradient dro_beta * log r pulls it back, as in veRL.
    dro_beta: veRL has no default (it must be set, > 0); 0.05 here, and 0 gives ``reinforce``.
    """
    # 0 outside the mask first: an inf there (garbage in padding) would make the square's gradient NaN.
    lr = torch.where(response_mask > 0, log_probs - old_log_probs, torch.zeros_like(log_probs))
    loss = -advantages * log_probs + 0.5 * dro_beta * lr.square()
    metrics = _unclipped_metrics(log_probs, old_log_probs, response_mask)
    return _zero_outside(loss, response_mask), metrics


POLICY_LOSSES = Registry("policy loss", check_signature=True)
POLICY_LOSSES.register("ppo_clip", ppo_clip, DualClipParams)
POLICY_LOSSES.register("gspo", gspo, DualClipParams)
POLICY_LOSSES.register("cispo", cispo, ClipParams)
POLICY_LOSSES.register("gmpo", gmpo, ClipParams)
POLICY_LOSSES.register("vanilla", vanilla)
POLICY_LOSSES.register("reinforce", reinforce, aliases=("gpg",))
POLICY_LOSSES.register("sapo", sapo, SapoParams)
POLICY_LOSSES.register("clip_cov", clip_cov, ClipCovParams, validate=_check_clip_cov, runtime=("generator",))
POLICY_LOSSES.register("kl_cov", kl_cov, KLCovParams)
POLICY_LOSSES.register("dppo_tv", dppo_tv, DualClipParams)
POLICY_LOSSES.register("dppo_kl", dppo_kl, DualClipParams)
POLICY_LOSSES.register("dro", dro, DroParams)


def get_policy_loss(name: str):
    """The loss function by name; unknown names raise ValueError listing the valid ones."""
    return POLICY_LOSSES.entry(name).fn
