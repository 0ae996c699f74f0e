"""The transform some models apply to their LM head's output before the softmax, for the paths
that compute logits from the head's weight themselves (fused log-probs, GKD's chunked JSD):

    logits = cap * tanh(scale * z / cap)     cap > 0 (Gemma-2/3's final_logit_softcapping)
    logits = scale * z                       cap = 0 (Cohere's logit_scale, Granite's 1 / logits_scaling)

with z = hidden @ head.T. What a model declares is read by models/checks.logit_transform;
(scale, cap) = (1, 0) is no transform. The temperature divides the result, as in generation.
"""
from __future__ import annotations

import torch


def cap_logits(z: torch.Tensor, scale: float = 1.0, softcap: float = 0.0) -> torch.Tensor:
    """The transformed logits (any shape), out of place and differentiable."""
    if scale != 1.0:
        z = z * scale
    return softcap * torch.tanh(z / softcap) if softcap > 0 else z


def cap_logits_(z: torch.Tensor, scale: float = 1.0, softcap: float = 0.0) -> torch.Tensor:
    """cap_logits in place on a fresh buffer z; returns z."""
    if scale != 1.0:
        z.mul_(scale)
    if softcap > 0:
        z.div_(softcap).tanh_().mul_(softcap)
    return z


def cap_slope(out_over_t: torch.Tensor, temperature: float, scale: float, softcap: float) -> torch.Tensor | float:
    """d logits / d z, given the transformed logits divided by the temperature (n, V):
    scale (1 - tanh^2) = scale (1 - (logits / cap)^2) with a cap, the constant scale without."""
    if softcap <= 0:
        return scale
    return (out_over_t * (temperature / softcap)).square_().neg_().add_(1.0).mul_(scale)
