"""Advantage estimators. One input dataclass, one signature, one registry.

Every estimator is ``fn(inp: AdvantageInput) -> (advantages (B, T), returns (B, T))``; one
with hyper-parameters that are not ``AdvantageInput`` fields (an estimator defined outside the
package, ``optimal_token_baseline``'s ``handle_zero_tail``) takes them as keyword-only arguments
too (``estimator_kwargs``).
Group estimators take explicit ``group_ids`` (B,) int64 in any order with unequal group sizes;
the group statistics are computed with ``torch.unique`` + ``index_add_`` (no Python loop).

``ADVANTAGE_ESTIMATORS`` is an ``algos.registry.Registry``: each entry's params dataclass
names the ``algorithm.<key>`` settings the estimator reads (copied into ``AdvantageInput`` by
the trainer), and its traits say which inputs it needs (the config validator and the trainer
read them; the module-level sets are live views of the traits, so an estimator registered
later is in them): ``needs_values`` (a critic), ``needs_groups`` (``group_ids``, i.e.
rollout.n > 1 makes sense), ``needs_baseline`` (``baseline_rewards``, ReMax's greedy rollout
reward), ``needs_token_stats`` (``old_log_probs`` and ``sum_pi_squared`` from the actor's
old-log-prob pass, run for them even on-policy).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .masked import _safe_div, _zero_outside, masked_sum, masked_whiten, masked_whiten_
from .registry import Registry, param
from .scan import discount_levels, discounted_reverse_cumsum_with


@dataclass
class AdvantageInput:
    """Everything an advantage estimator may read. Shapes: B sequences, T response length."""

    token_level_rewards: torch.Tensor  # (B, T) reward per token (outcome on the last valid token)
    response_mask: torch.Tensor  # (B, T) 1 on tokens the policy generated and that count
    values: torch.Tensor | None = None  # (B, T) critic values V(s_t) (gae only)
    group_ids: torch.Tensor | None = None  # (B,) int64: samples of the same prompt share an id
    gamma: float = 1.0  # discount factor
    lam: float = 1.0  # GAE lambda of the actor's advantages
    lam_critic: float | None = None  # GAE lambda of the critic's returns (None -> lam); VAPO
    length_adaptive_alpha: float | None = None  # VAPO: actor lambda = 1 - 1/(alpha * L) per seq
    norm_by_std: bool = True  # grpo: divide by the group std (False = Dr.GRPO)
    eps: float = 1e-6  # grpo: std epsilon
    baseline_rewards: torch.Tensor | None = None  # (B,) remax: reward of the greedy rollout
    whiten: bool = True  # gae: whiten the advantages over the mask
    old_log_probs: torch.Tensor | None = None  # (B, T) optimal_token_baseline: log pi of the sampled tokens
    sum_pi_squared: torch.Tensor | None = None  # (B, T) optimal_token_baseline: sum over the vocabulary of pi^2


# --------------------------------------------------------------------------- helpers


def check_rewards_in_mask(rewards: torch.Tensor, mask: torch.Tensor) -> None:
    """Refuse a finite non-zero reward on a masked position (B, T): ValueError naming the first
    (row, position). Non-finite values there are padding garbage, ignored as everywhere in algos
    (masked.py). One host sync (the advantages run on the controller, on the CPU)."""
    off = (rewards != 0) & torch.isfinite(rewards) & (mask == 0)
    if bool(off.any()):
        i, t = off.nonzero()[0].tolist()
        raise ValueError(f"token_level_rewards[{i}, {t}] = {float(rewards[i, t]):g} lies outside response_mask "
                         f"(row {i}, position {t}): an outcome estimator would drop it; place each reward on a "
                         f"valid response token (an outcome reward on the row's last one) or zero it there")


def _sequence_scores(inp: AdvantageInput) -> torch.Tensor:
    """Sum of token rewards over the response. -> (B,)

    A reward outside the mask is refused (``check_rewards_in_mask``), not dropped: veRL's outcome
    estimators sum a row over every position, reinforge over the valid ones, and a reward on a
    masked position is a bug upstream (every reward source here zeroes its rewards there: the
    reward worker's placement, multi-turn turn rewards, the KL-in-reward penalty)."""
    check_rewards_in_mask(inp.token_level_rewards, inp.response_mask)
    return masked_sum(inp.token_level_rewards, inp.response_mask, dim=-1)


def _broadcast(seq_adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence advantage -> (B, T), zero outside the mask."""
    return _zero_outside(seq_adv.unsqueeze(-1).expand(mask.shape), mask)


def _groups(group_ids: torch.Tensor | None, name: str) -> tuple[torch.Tensor, int]:
    """group_ids (B,) -> (dense index (B,) in [0, G), G)."""
    if group_ids is None:
        raise ValueError(f"advantage estimator {name!r} needs group_ids (B,)")
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    return inv, uniq.numel()


def _group_sum(x: torch.Tensor, inv: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Per-group sum of x (B,) -> (G,)."""
    return x.new_zeros(n_groups).index_add_(0, inv, x)


def _group_mean_count(x: torch.Tensor, inv: torch.Tensor, n_groups: int):
    count = _group_sum(torch.ones_like(x), inv, n_groups)  # (G,)
    return _group_sum(x, inv, n_groups) / count, count


def _group_std(centered: torch.Tensor, inv: torch.Tensor, n_groups: int, count: torch.Tensor) -> torch.Tensor:
    """Unbiased group std from (B,) deviations from the group mean -> (G,), 0 for singletons."""
    return _safe_div(_group_sum(centered**2, inv, n_groups), count - 1).sqrt()


# Rows per block of `_discounted_scan`: about this many (R, T) elements at a time. A block
# allocates ~25 bytes of scratch per element. In blocks of 2^16 elements (~1.6 MiB) the
# scratch stays in cache and the allocator hands the same memory back from block to block;
# one pass over a 64 x 8192 batch needs ~16 MiB, which glibc returns to the OS after each
# call and faults in again the next time (~1.4 us per 4 KiB page: 2x the arithmetic). Larger
# blocks were faster on a warm heap but, with some heap layouts, faulted ~2000 pages per call.
# benchmarks/algos.py measures the result.
_SCAN_BLOCK_ELEMENTS = 1 << 16


def _discounted_scan(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    mask: torch.Tensor,
    gamma: float,
    lams: list[torch.Tensor],
    outs: list[torch.Tensor],
    chunk: int = 32,
) -> None:
    """GAE recursion of the classic per-time-step loop, vectorised, once per lambda vector.
    rewards, values, mask: (R, T) (values None: all zero); lams: (R,) each; the advantages
    for lams[i] are written into outs[i] (R, T).

    Masked positions carry the recursion: a valid token's "next value" is the value of the
    next *valid* token (0 if none), and a masked token's advantage equals the next valid
    token's (0 if none), exactly like the loop's ``nextvalues`` / ``lastgaelam`` carry.
    So the valid tokens are packed to the left of each row (k = their rank), the recursion runs
    there with one coefficient gamma * lam per row, and every position t reads the packed
    result at k(t) = the number of valid tokens before t: its own slot if valid, the next valid
    token's if masked, the zero slot past the end if there is none. The packing is done once
    for all the lambdas (VAPO's actor and critic). Rows go in blocks of about
    ``_SCAN_BLOCK_ELEMENTS`` elements (see there why).
    """
    R, T = rewards.shape
    W = -(-(T + 1) // chunk) * chunk  # packed width: T slots, a zero/scratch column, padding
    levels = [discount_levels((gamma * lam).to(rewards.dtype), W, chunk) for lam in lams]
    rows = max(1, _SCAN_BLOCK_ELEMENTS // max(W, 1))
    for r0 in range(0, R, rows):
        r1 = min(R, r0 + rows)
        ones = mask[r0:r1].bool().to(torch.int32)  # (n, T) 1 on valid tokens
        # Exclusive count of valid tokens before t (an int32 cumsum is ~20x faster than one
        # over the bool mask).
        k = ones.cumsum(-1, dtype=torch.int32).sub_(ones)
        # Scatter slots: k on valid tokens, the scratch column T on masked ones (k <= T), as
        # a max: cheaper than a masked_fill.
        idx = torch.maximum(k, ones.sub_(1).mul_(-T)).to(torch.long)
        del ones
        packed = rewards.new_zeros(2, r1 - r0, W)  # [delta, values / scan output], valid tokens left
        delta = packed[0].scatter_(1, idx, rewards[r0:r1])
        if values is not None:
            # delta_j = r_j + gamma * V_{j+1} - V_j on the packed rows (0 past each row's end).
            v = packed[1].scatter_(1, idx, values[r0:r1])
            v[:, T] = 0.0
            delta[:, :-1].add_(v[:, 1:], alpha=gamma).sub_(v[:, :-1])
        delta[:, T] = 0.0  # the masked tokens' scratch column
        idx.copy_(k)
        for lv, out in zip(levels, outs):
            adv = discounted_reverse_cumsum_with(delta, lv, slice(r0, r1), out=packed[1])
            torch.gather(adv, 1, idx, out=out[r0:r1])


# --------------------------------------------------------------------------- estimators


def gae(inp: AdvantageInput):
    """Generalised Advantage Estimation (https://arxiv.org/abs/1506.02438), with VAPO options.

    A_t = delta_t + gamma * lam * A_{t+1}, delta_t = r_t + gamma V_{t+1} - V_t.
    returns = A(lam_critic) + values (VAPO decoupled GAE, https://arxiv.org/abs/2504.05118:
    the critic uses lam_critic, typically 1.0). Actor lambda: ``lam``, or per sequence
    clamp(1 - 1/(alpha * L), 0, 1) with ``length_adaptive_alpha`` (VAPO length-adaptive GAE).
    Advantages are whitened over the mask when ``whiten`` (then 0 outside the mask);
    otherwise they are returned raw, equal to the classic loop everywhere.
    """
    if inp.values is None:
        raise ValueError("advantage estimator 'gae' needs values (B, T) from a critic")
    r, v, m = inp.token_level_rewards, inp.values.to(inp.token_level_rewards.dtype), inp.response_mask
    B = r.shape[0]
    lam_c = inp.lam if inp.lam_critic is None else inp.lam_critic
    lam_actor = torch.full((B,), float(inp.lam), dtype=r.dtype, device=r.device)
    if inp.length_adaptive_alpha is not None:
        length = m.to(r.dtype).sum(-1)  # (B,)
        lam_actor = (1.0 - 1.0 / (inp.length_adaptive_alpha * length)).clamp(0.0, 1.0)
    # Both outputs in one allocation, every other step in place or in per-block scratch: on a
    # large batch the page faults of fresh memory cost more than the arithmetic.
    adv, returns = r.new_empty(2, *r.shape).unbind(0)
    if inp.length_adaptive_alpha is None and lam_c == inp.lam:
        _discounted_scan(r, v, m, inp.gamma, [lam_actor], [adv])
        torch.add(adv, v, out=returns)
    else:  # VAPO: the critic's returns from their own lambda, on the same packing
        _discounted_scan(r, v, m, inp.gamma, [lam_actor, torch.full_like(lam_actor, float(lam_c))], [adv, returns])
        returns.add_(v)
    if inp.whiten:
        masked_whiten_(adv, m)
    return adv, returns


def grpo(inp: AdvantageInput):
    """GRPO (https://arxiv.org/abs/2402.03300): (r - group mean) / (group std + eps).

    Sequence score = sum of token rewards; std is the unbiased group std; a singleton group
    gets advantage 0. ``norm_by_std=False`` skips the division (Dr.GRPO,
    https://arxiv.org/abs/2503.20783). returns = advantages.
    """
    inv, G = _groups(inp.group_ids, "grpo")
    s = _sequence_scores(inp)  # (B,)
    mean, count = _group_mean_count(s, inv, G)  # (G,), (G,)
    centered = s - mean[inv]  # exactly 0 in singleton groups
    if inp.norm_by_std:
        centered = _safe_div(centered, _group_std(centered, inv, G, count)[inv] + inp.eps)  # 0/0 -> 0 (eps = 0)
    adv = _broadcast(centered, inp.response_mask)
    return adv, adv


def rloo(inp: AdvantageInput):
    """RLOO (https://arxiv.org/abs/2402.14740): r_i - mean of the other samples of the group.

    Singleton groups get advantage 0. returns = advantages.
    """
    inv, G = _groups(inp.group_ids, "rloo")
    s = _sequence_scores(inp)
    total = _group_sum(s, inv, G)
    count = _group_sum(torch.ones_like(s), inv, G)
    n = count[inv]
    baseline = _safe_div(total[inv] - s, n - 1)
    adv = torch.where(n > 1, s - baseline, torch.zeros_like(s))
    adv = _broadcast(adv, inp.response_mask)
    return adv, adv


def reinforce(inp: AdvantageInput):
    """Plain REINFORCE (Williams, 1992) without a baseline: every token of a response gets
    the response's score. With 0/1 rewards this is rejection-sampling fine-tuning (RAFT/RFT):
    only correct samples move the policy, and nothing is pushed down. returns = advantages.
    """
    adv = _broadcast(_sequence_scores(inp), inp.response_mask)
    return adv, adv


def reinforce_plus_plus(inp: AdvantageInput):
    """REINFORCE++ (https://arxiv.org/abs/2501.03262): discounted return-to-go, whitened.

    G_t = r_t + gamma * G_{t+1} over valid tokens (masked tokens carry G, as in GAE with
    V = 0, lam = 1). Advantages = masked_whiten(G); returns = G (raw).
    """
    r, m = inp.token_level_rewards, inp.response_mask
    returns = torch.empty_like(r)
    _discounted_scan(r, None, m, inp.gamma, [torch.ones(r.shape[0], dtype=r.dtype, device=r.device)], [returns])
    returns = _zero_outside(returns, m)  # masked tokens carried the next return
    return masked_whiten(returns, m), returns


def reinforce_plus_plus_baseline(inp: AdvantageInput):
    """REINFORCE++-baseline: subtract the group mean score, broadcast, whiten over the batch."""
    inv, G = _groups(inp.group_ids, "reinforce_plus_plus_baseline")
    s = _sequence_scores(inp)
    mean, _ = _group_mean_count(s, inv, G)
    adv = masked_whiten(_broadcast(s - mean[inv], inp.response_mask), inp.response_mask)
    return adv, adv


def remax(inp: AdvantageInput):
    """ReMax (https://arxiv.org/abs/2310.10505): score minus the greedy rollout's score.

    baseline_rewards (B,): reward of the greedy response to the same prompt.
    """
    if inp.baseline_rewards is None:
        raise ValueError("advantage estimator 'remax' needs baseline_rewards (B,)")
    s = _sequence_scores(inp)
    adv = _broadcast(s - inp.baseline_rewards.to(s.dtype), inp.response_mask)
    return adv, adv


def opo(inp: AdvantageInput):
    """OPO (https://arxiv.org/abs/2505.23585): length-weighted group baseline.

    b = sum_j L_j r_j / sum_j L_j over the group (L = valid response length); A = r - b.
    Groups whose responses are all empty get advantage 0.
    """
    inv, G = _groups(inp.group_ids, "opo")
    s = _sequence_scores(inp)
    length = inp.response_mask.to(s.dtype).sum(-1)  # (B,)
    baseline = _safe_div(_group_sum(length * s, inv, G), _group_sum(length, inv, G))
    adv = _broadcast(s - baseline[inv], inp.response_mask)
    return adv, adv


def grpo_passk(inp: AdvantageInput):
    """GRPO for pass@k (veRL ``grpo_passk``, which cites https://arxiv.org/abs/2503.19595).

    Only the best response of a group is credited: A = r_max - r_second_max on it, 0 on every
    other response (so a tie at the top gives the whole group 0). Divided by the unbiased
    group std + eps when ``norm_by_std``. Singleton groups get 0 (veRL raises). returns = advantages.
    """
    inv, G = _groups(inp.group_ids, "grpo_passk")
    s = _sequence_scores(inp)  # (B,)
    gmax = s.new_full((G,), -torch.inf).scatter_reduce(0, inv, s, "amax")  # (G,)
    is_max = s == gmax[inv]  # (B,)
    n_max = _group_sum(is_max.to(s.dtype), inv, G)  # (G,) rows sharing the top score
    below = torch.where(is_max, torch.full_like(s, -torch.inf), s)
    second = s.new_full((G,), -torch.inf).scatter_reduce(0, inv, below, "amax")  # best score under the top
    second = torch.where(n_max > 1, gmax, second)  # a tie at the top: the runner-up equals the best
    mean, count = _group_mean_count(s, inv, G)
    gap = torch.where(count > 1, gmax - second, torch.zeros_like(gmax))  # (G,); -inf never reaches here
    if inp.norm_by_std:
        gap = _safe_div(gap, _group_std(s - mean[inv], inv, G, count) + inp.eps)
    adv = _broadcast(torch.where(is_max, gap[inv], torch.zeros_like(s)), inp.response_mask)
    return adv, adv


def gpg(inp: AdvantageInput):
    """GPG (https://arxiv.org/abs/2504.02546), as veRL's ``gpg`` estimator computes it.

    A = alpha * (r - group mean), no std division, alpha = B / max(#rows with a non-zero score, 1)
    over the whole batch (veRL's form of the paper's gradient-estimation correction, which
    rescales the batch by its share of rows that carry a learning signal). f_norm = 1.
    Singleton groups get 0 (veRL uses mean 0 there, i.e. alpha * r). returns = advantages.
    """
    inv, G = _groups(inp.group_ids, "gpg")
    s = _sequence_scores(inp)
    mean, _ = _group_mean_count(s, inv, G)
    alpha = s.numel() / (s != 0).sum().clamp(min=1).to(s.dtype)  # 0-dim tensor: no .item()
    adv = _broadcast(alpha * (s - mean[inv]), inp.response_mask)
    return adv, adv


# veRL's epsilon of the optimal token baseline's denominator (not a config key there either).
_OTB_EPS = 1e-8


def optimal_token_baseline(inp: AdvantageInput, *, handle_zero_tail: bool = True):
    """Optimal token baseline (veRL ``optimal_token_baseline``; https://richardli.xyz/optimal-token-baseline).

    G_t = sum_{j >= t} r_j (undiscounted return-to-go over valid tokens), per-token weight
    w_t = 1 - 2 pi_t + sum_v pi_v^2 (the squared norm of the logit gradient of log pi_t, with
    pi_t = exp(old_log_probs)), W_t = sum_{j <= t} w_j over valid tokens, and per group and
    position B_t = sum_i G_t W_t m_t / (sum_i W_t m_t + 1e-8) over the group's rows i;
    A_t = (G_t - B_t) m_t. Singleton groups: B = 0 (A = G).

    ``handle_zero_tail`` (default True, veRL's default, which its trainer keeps): B_t = 0 where a
    row is the only valid row of its group at position t. There the baseline would be the row's own
    G_t (A = 0, no gradient); with the option the row keeps A = G_t. On right-padded masks these are
    exactly veRL's positions (the unique longest row, from the second-longest row's length on). With
    holes veRL counts the second-longest row's valid tokens and zeroes from that position, which can
    cover positions where other rows are valid and miss a hole where the row is alone; here the rule
    is per position, as the baseline is.

    returns = G on valid tokens and 0 outside the mask, response holes included (veRL keeps the
    reward-to-go in holes): every per-token output of reinforge is 0 outside the mask, and nothing
    reads returns there. Not implemented from veRL: the rollout-IS rescaling of w.
    """
    if inp.old_log_probs is None or inp.sum_pi_squared is None:
        raise ValueError("advantage estimator 'optimal_token_baseline' needs old_log_probs and sum_pi_squared (B, T)")
    inv, G = _groups(inp.group_ids, "optimal_token_baseline")
    r, m = inp.token_level_rewards, inp.response_mask.to(inp.token_level_rewards.dtype)
    ret = (r * m).flip(-1).cumsum(-1).flip(-1) * m  # (B, T)
    w = 1.0 - 2.0 * inp.old_log_probs.to(r.dtype).exp() + inp.sum_pi_squared.to(r.dtype)
    wm = (w * m).cumsum(-1) * m  # (B, T) W_t on valid tokens
    num = r.new_zeros(G, r.shape[1]).index_add_(0, inv, ret * wm)  # (G, T)
    den = r.new_zeros(G, r.shape[1]).index_add_(0, inv, wm)
    count = _group_sum(torch.ones_like(r[:, 0]), inv, G)  # (G,)
    baseline = torch.where(count[:, None] > 1, num / (den + _OTB_EPS), torch.zeros_like(num))[inv]  # (B, T)
    if handle_zero_tail:  # no baseline where the row is its group's only valid row at t
        alone = r.new_zeros(G, r.shape[1]).index_add_(0, inv, m)[inv] == 1  # (B, T)
        baseline = baseline.masked_fill(alone, 0.0)
    return (ret - baseline) * m, ret


# --------------------------------------------------------------------------- registry
# Params: the algorithm.* keys an estimator reads (AdvantageInput's fields of the same meaning;
# norm_adv_by_std is AdvantageInput.norm_by_std).


@dataclass
class DiscountParams:
    gamma: float = param(1.0, "[0, 1]", "Discount factor.")


@dataclass
class GAEParams(DiscountParams):
    lam: float = param(1.0, "[0, 1]", "GAE lambda for the actor's advantages.")
    lam_critic: Optional[float] = param(None, "[0, 1]", "GAE lambda for the critic's returns (VAPO decoupled GAE); "
                                                        "None = lam.")
    length_adaptive_alpha: Optional[float] = param(None, "(0, inf)", "VAPO length-adaptive lambda = 1 - 1/(alpha * L); "
                                                                     "None disables.")


@dataclass
class GroupStdParams:
    norm_adv_by_std: bool = param(True, None, "GRPO: divide by the group std (False = Dr.GRPO).")


@dataclass
class OTBParams:
    handle_zero_tail: bool = param(True, None, "optimal_token_baseline: no baseline where a row is its group's only "
                                               "valid row at a position (veRL's default).")


ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
ADVANTAGE_ESTIMATORS.register("gae", gae, GAEParams, needs_values=True)
ADVANTAGE_ESTIMATORS.register("grpo", grpo, GroupStdParams, needs_groups=True)
ADVANTAGE_ESTIMATORS.register("rloo", rloo, needs_groups=True)
ADVANTAGE_ESTIMATORS.register("reinforce", reinforce, doc="Plain REINFORCE (Williams, 1992) without a baseline: "
                              "every token of a response gets its score (with 0/1 rewards: RAFT/RFT).")
ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus", reinforce_plus_plus, DiscountParams)
ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline", reinforce_plus_plus_baseline, needs_groups=True)
ADVANTAGE_ESTIMATORS.register("remax", remax, needs_baseline=True)
ADVANTAGE_ESTIMATORS.register("opo", opo, needs_groups=True)
ADVANTAGE_ESTIMATORS.register("grpo_passk", grpo_passk, GroupStdParams, needs_groups=True)
ADVANTAGE_ESTIMATORS.register("gpg", gpg, needs_groups=True)
ADVANTAGE_ESTIMATORS.register("optimal_token_baseline", optimal_token_baseline, OTBParams, needs_groups=True,
                              needs_token_stats=True)
NEEDS_VALUES = ADVANTAGE_ESTIMATORS.trait_set("needs_values")
NEEDS_GROUPS = ADVANTAGE_ESTIMATORS.trait_set("needs_groups")
NEEDS_BASELINE = ADVANTAGE_ESTIMATORS.trait_set("needs_baseline")
NEEDS_TOKEN_STATS = ADVANTAGE_ESTIMATORS.trait_set("needs_token_stats")


def get_advantage_estimator(name: str):
    """Look up an estimator by name; unknown names raise ValueError listing the valid ones."""
    return ADVANTAGE_ESTIMATORS.entry(name).fn


def estimator_kwargs(name: str, section: Any = None) -> dict[str, Any]:
    """The keywords of one call of estimator ``name``: its params that its function takes as
    keyword-only arguments, read from ``section`` (the algorithm config; defaults without it).
    Most built-in estimators take none (the trainer copies their settings into AdvantageInput's
    fields; ``optimal_token_baseline`` takes ``handle_zero_tail``); an estimator defined outside
    the package reads its hyper-parameters this way (docs/extending.md)."""
    e = ADVANTAGE_ESTIMATORS.entry(name)
    kw_only = {n for n, p in inspect.signature(e.fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
    return {k: v for k, v in e.kwargs(section).items() if k in kw_only} if kw_only else {}


@torch.no_grad()
def compute_advantages(name: str, inp: AdvantageInput, **hyper) -> tuple[torch.Tensor, torch.Tensor]:
    """Run estimator ``name`` on ``inp`` (no grad), with the keywords ``hyper`` (see
    ``estimator_kwargs``). -> (advantages (B, T), returns (B, T))."""
    return get_advantage_estimator(name)(inp, **hyper)
