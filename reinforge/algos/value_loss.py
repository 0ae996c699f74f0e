"""Critic loss and diagnostics."""

from __future__ import annotations

import torch

from .aggregation import agg_loss
from .masked import _safe_div, masked_mean, masked_var


def clipped_value_loss(
    vpreds: torch.Tensor,
    values_old: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    agg_mode: str = "token-mean",
    **agg_kwargs,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped value loss: 0.5 * agg(max((V - G)^2, (V_clip - G)^2)).

    vpreds, values_old, returns, response_mask: (B, T). V_clip = values_old +
    clip(vpreds - values_old, -c, c). ``cliprange_value=None`` gives the plain 0.5 * MSE.
    agg_kwargs (num_tokens, num_seqs, norm_const) go to ``agg_loss``.
    -> (loss scalar, {"vf_clipfrac": fraction of valid tokens where the clipped term is larger}).
    """
    loss1 = (vpreds - returns) ** 2
    if cliprange_value is None:
        loss_mat, clipped = loss1, torch.zeros_like(loss1, dtype=torch.bool)
    else:
        vclip = values_old + (vpreds - values_old).clamp(-cliprange_value, cliprange_value)
        loss2 = (vclip - returns) ** 2
        loss_mat, clipped = torch.maximum(loss1, loss2), loss2 > loss1
    loss = 0.5 * agg_loss(loss_mat, response_mask, agg_mode, **agg_kwargs)
    with torch.no_grad():
        clipfrac = masked_mean(clipped.float(), response_mask)
    return loss, {"vf_clipfrac": clipfrac}


@torch.no_grad()
def explained_variance_moments(preds: torch.Tensor, targets: torch.Tensor,
                               mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Masked sums from which `explained_variance_from_moments` reads the explained variance:
    (B, T) -> scalars. Sums add up, so micro-batches and data-parallel ranks can each compute
    theirs and the total gives the whole batch's value whatever the split."""
    m = mask.float()
    d, t = (targets - preds).float(), targets.float()
    return {"n": m.sum(), "t": (t * m).sum(), "t2": (t * t * m).sum(), "d": (d * m).sum(), "d2": (d * d * m).sum()}


def explained_variance_from_moments(s: dict[str, torch.Tensor]) -> torch.Tensor:
    """1 - Var[targets - preds] / Var[targets] from (summed) `explained_variance_moments`:
    the same quantity as `explained_variance`, in one-pass form (E[x^2] - E[x]^2)."""
    n = s["n"].clamp(min=1)
    var_t = s["t2"] / n - (s["t"] / n) ** 2
    var_d = s["d2"] / n - (s["d"] / n) ** 2
    return torch.where(var_t > 0, 1 - var_d / var_t.clamp(min=1e-12), torch.zeros_like(var_t))


def explained_variance(preds: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var[targets - preds] / Var[targets] over the mask. (B, T) -> scalar.

    1 is a perfect critic, 0 predicts no better than the mean, < 0 worse. Returns 0 when the
    targets have zero variance (undefined). Two passes (centred variances), so more accurate
    than the one-pass moment form that split batches need.
    """
    t, m = targets.float(), mask.float()
    vt = masked_var(t, m, unbiased=False)
    return torch.where(vt > 0, 1 - _safe_div(masked_var(t - preds.float(), m, unbiased=False), vt), torch.zeros_like(vt))
