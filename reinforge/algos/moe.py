"""Mixture-of-experts routing math: the load-balancing auxiliary loss and the expert-load metrics.

The loss is the Switch Transformer / GShard form (https://arxiv.org/abs/2101.03961, eq. 4-6), per
MoE layer l and averaged over layers, as Megatron-Core computes it:

    aux = mean_l  E * sum_e f_{l,e} * P_{l,e}

f_{l,e}: the fraction of layer l's N x k routing slots (N tokens, k experts each) sent to expert e
(no gradient: it counts choices); P_{l,e}: the mean router probability of e over the N tokens
(softmax of the router logits; the gradient flows through it). A perfectly balanced layer gives
f = P = 1/E and aux = 1. transformers' own `load_balancing_loss_func` differs: it averages f and P
over layers *before* taking their product and lets f sum to k, so its balanced value is k; the
per-layer form penalises each layer's imbalance, which a mean over layers can cancel.

The experts counted in f are the ones the forward used: the router's own top-k, or under routing
replay the rollout's (models/moe.py), so the metrics describe the computation that ran.

Shapes: N tokens of one forward (b x L, padding included, masked by `mask`), E experts, k top-k.
"""
from __future__ import annotations

import torch


def expert_fractions(experts: torch.Tensor, mask: torch.Tensor, num_experts: int) -> torch.Tensor:
    """experts (N, k) int, mask (N,) 0/1 -> f (E,): each expert's share of the masked tokens' N x k
    routing slots (sums to 1 when any token is masked in)."""
    k = experts.shape[-1]
    w = mask.float()[:, None].expand(-1, k).reshape(-1)  # (N k,)
    counts = torch.zeros(num_experts, dtype=torch.float32, device=experts.device)
    counts.scatter_add_(0, experts.reshape(-1).long(), w)
    return counts / w.sum().clamp(min=1.0)  # 0/1 weights: a count, >= 1 when any token counts


def load_balancing_loss(router_logits: list[torch.Tensor], experts: list[torch.Tensor],
                        mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per layer: router_logits (N, E), experts (N, k) the experts the forward used; mask (N,) the
    tokens that count (1 = real). -> (aux loss (), metrics):
    `moe_load_max` / `moe_load_min`: the largest / smallest f_{l,e} over layers and experts
    (balanced: 1/E each), `moe_load_imbalance`: mean over layers of max_e f / (1/E) (1 = balanced)."""
    m = mask.float().reshape(-1)
    n = m.sum().clamp(min=1.0)
    losses, fracs = [], []
    for logits, chosen in zip(router_logits, experts):
        E = logits.shape[-1]
        f = expert_fractions(chosen, m, E)  # (E,) no grad: counts
        p = (torch.softmax(logits.float(), dim=-1) * m[:, None]).sum(0) / n  # (E,)
        losses.append(E * (f * p).sum())
        fracs.append(f)
    f_all = torch.stack(fracs)  # (layers, E)
    E = f_all.shape[-1]
    metrics = {"moe_load_max": f_all.max(), "moe_load_min": f_all.min(),
               "moe_load_imbalance": (f_all.max(-1).values * E).mean()}
    return torch.stack(losses).mean(), metrics
