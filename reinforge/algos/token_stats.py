"""Per-token statistics of a policy's distribution beyond the sampled token's log-prob."""

from __future__ import annotations

import torch

from .logprobs import sampling_filter_

# Rows of (n, V) logits handled at a time: bounds the fp32 temporaries to a few (rows, V) blocks.
_ROWS = 1024


@torch.no_grad()
def sum_pi_squared_from_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                               top_p: float = 1.0) -> torch.Tensor:
    """sum_v pi_v^2 (n,) of the distribution softmax(filter(logits / temperature)), logits (n, V).

    = exp(logsumexp(2 z) - 2 logsumexp(z)) (no (n, V) probabilities kept); the filter is the
    rollout's top-k / top-p (algos.logprobs.sampling_filter_), so pi is what was sampled from.
    The optimal token baseline's w_t = 1 - 2 pi_t + sum pi^2 reads it.
    """
    out = []
    for block in logits.split(_ROWS):
        z = block.float() / temperature
        sampling_filter_(z, top_k, top_p)
        out.append((torch.logsumexp(2.0 * z, -1) - 2.0 * torch.logsumexp(z, -1)).exp())
    return torch.cat(out) if out else logits.new_zeros(0, dtype=torch.float32)
