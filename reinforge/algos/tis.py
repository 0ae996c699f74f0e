"""Truncated importance sampling between the policy the trainer evaluates and the one that
sampled (https://fengyao.notion.site/off-policy-rl): vLLM's kernels and sampling differ slightly
from the trainer's forward, and the asynchronous producer's behaviour copy lags the weights, so
each token's policy loss is weighted by min(exp(old_log_probs - rollout_log_probs), cap).
The correction is per token by construction: `rollout_log_probs` holds each token's log-prob
under the weights that sampled it, so with partial rollouts (a row's tokens sampled by several
versions, token_versions) every token is corrected against its own behaviour version.

Shapes: B sequences, T response tokens.
"""
from __future__ import annotations

import torch

from reinforge.algos.masked import masked_mean


def tis_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(B, T) trainer and rollout log-probs -> per-token weights min(exp(old - rollout), cap) (B, T)
    (no gradient; 0 off the mask) and metrics of the gap."""
    m = mask.float()
    gap = (old_log_probs - rollout_log_probs).detach() * m  # (B, T)
    ratio = torch.exp(gap)
    w = torch.clamp(ratio, max=cap) * m
    return w, {"rollout_corr/logprob_gap_abs_mean": masked_mean(gap.abs(), m),
               "rollout_corr/logprob_gap_max": gap.abs().max(),
               "rollout_corr/tis_weight_mean": masked_mean(w, m),
               "rollout_corr/tis_clip_frac": masked_mean((ratio > cap).float(), m)}
