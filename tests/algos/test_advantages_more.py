"""The breadth estimators of issue 16: GRPO pass@k, GPG and the optimal token baseline (veRL
``grpo_passk``, ``gpg``, ``optimal_token_baseline``).

Hand-computed values on a small batch with holes in the mask, unequal groups in mixed order,
a tie at the top and a singleton; then each vectorised estimator against a per-group loop.
"""

import pytest
import torch
from algos_helpers import random_mask

from reinforge.algos import NEEDS_GROUPS, AdvantageInput, compute_advantages

# Rows in mixed group order. Group 5: scores 1, 0, 0.5 (one best); group 2: 1, 1, 0 (tie at the
# top); group 9: a singleton; group 4: 0, 0.
GROUPS = torch.tensor([5, 2, 5, 9, 2, 4, 5, 2, 4])
SCORES = torch.tensor([1.0, 1.0, 0.0, 2.0, 1.0, 0.0, 0.5, 0.0, 0.0], dtype=torch.float64)


def _hand_batch():
    """Scores on the last valid token of masks with holes -> (rewards, mask), both (9, 5)."""
    mask = torch.ones(9, 5, dtype=torch.float64)
    mask[0, 3:] = 0
    mask[1, 1] = 0  # a hole (tool tokens) before the last valid token
    mask[3, 2:] = 0
    mask[6, 0] = 0
    rewards = torch.zeros_like(mask)
    last = (mask * torch.arange(5)).argmax(-1)  # (9,) last valid position
    rewards[torch.arange(9), last] = SCORES
    return rewards, mask


def _run(name, rewards, mask, groups, **kw):
    adv, ret = compute_advantages(name, AdvantageInput(rewards, mask, group_ids=groups, **kw))
    assert torch.equal(adv, ret)
    assert torch.all(adv[mask == 0] == 0)
    return adv


def test_grpo_passk_hand_computed():
    rewards, mask = _hand_batch()
    # Group 5: the best row (0) gets 1 - 0.5 = 0.5; the group std (unbiased) of (1, 0, 0.5) is 0.5.
    want = torch.zeros(9, dtype=torch.float64)
    want[0] = 0.5
    adv = _run("grpo_passk", rewards, mask, GROUPS, norm_by_std=False)
    torch.testing.assert_close(adv, want[:, None] * mask, rtol=0, atol=0)
    adv = _run("grpo_passk", rewards, mask, GROUPS, norm_by_std=True, eps=0.0)
    torch.testing.assert_close(adv, (want / 0.5)[:, None] * mask, rtol=1e-12, atol=0)
    adv = _run("grpo_passk", rewards, mask, GROUPS, norm_by_std=True, eps=1e-6)
    assert adv[0, 0].item() == pytest.approx(0.5 / (0.5 + 1e-6), rel=1e-12)


def test_gpg_hand_computed():
    rewards, mask = _hand_batch()
    # alpha = B / #non-zero scores = 9 / 5. Group means: 0.5, 2/3, (singleton), 0.
    alpha = 9 / 5
    want = torch.tensor([alpha * 0.5, alpha / 3, alpha * -0.5, 0.0, alpha / 3, 0.0, 0.0, alpha * -2 / 3, 0.0],
                        dtype=torch.float64)
    adv = _run("gpg", rewards, mask, GROUPS)
    torch.testing.assert_close(adv, want[:, None] * mask, rtol=1e-12, atol=1e-15)
    # No row with a non-zero score: alpha = B / 1 and every advantage is 0 (all groups tied).
    assert torch.all(_run("gpg", torch.zeros_like(rewards), mask, GROUPS) == 0)


def _loop_passk(s, groups, norm, eps):
    out = torch.zeros_like(s)
    for g in groups.unique():
        rows = (groups == g).nonzero().flatten().tolist()
        if len(rows) < 2:
            continue
        vals = sorted(((s[i].item(), i) for i in rows), reverse=True)
        gap = vals[0][0] - vals[1][0]
        if norm:
            gap = gap / (s[rows].std().item() + eps)
        out[vals[0][1]] = gap
    return out


def _loop_gpg(s, groups):
    alpha = len(s) / max(int((s != 0).sum()), 1)
    out = torch.zeros_like(s)
    for g in groups.unique():
        rows = (groups == g).nonzero().flatten()
        if len(rows) > 1:
            out[rows] = alpha * (s[rows] - s[rows].mean())
    return out


@pytest.mark.parametrize("norm", [True, False])
def test_vectorised_equals_loop(gen, norm):
    B, T = 40, 11
    mask = random_mask(B, T, gen, empty_rows=2).double()
    groups = torch.randint(0, 9, (B,), generator=gen) * 7 + 3  # unequal sizes, sparse ids
    # Scores from a small set so that ties (at the top and elsewhere) occur; none outside the mask
    # (the outcome estimators refuse one there).
    rewards = torch.randint(0, 3, (B, T), generator=gen).double() * 0.5 * (torch.rand(B, T, generator=gen) < 0.3)
    rewards = rewards * mask
    s = (rewards * mask).sum(-1)
    for name, want in (("grpo_passk", _loop_passk(s, groups, norm, 1e-6)), ("gpg", _loop_gpg(s, groups))):
        adv = _run(name, rewards, mask, groups, norm_by_std=norm)
        torch.testing.assert_close(adv, want[:, None] * mask, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("name", ["grpo_passk", "gpg"])
def test_needs_groups(name):
    assert name in NEEDS_GROUPS
    with pytest.raises(ValueError, match="needs group_ids"):
        compute_advantages(name, AdvantageInput(torch.zeros(2, 3), torch.ones(2, 3)))


def _otb_inputs(gen, B, T):
    """Random old log-probs and sum pi^2 consistent with a distribution: pi_t <= 1, pi_t^2 <= sum pi^2 <= 1."""
    pi = torch.rand(B, T, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    spi2 = pi**2 + (1 - pi) ** 2 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    return pi.log(), spi2


@pytest.mark.parametrize("zero_tail", [False, True])
def test_optimal_token_baseline_hand_computed(zero_tail):
    # Group 1: two rows of 3 tokens, row 1 has a hole at t=1; group 0: a singleton.
    mask = torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 0]], dtype=torch.float64)
    rewards = torch.tensor([[0, 0, 1.0], [0, 0, 3.0], [0, 2.0, 0]], dtype=torch.float64)
    groups = torch.tensor([1, 1, 0])
    pi = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.9, 0.5], [0.5, 0.5, 0.5]], dtype=torch.float64)
    spi2 = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.9, 0.5], [0.5, 0.5, 0.5]], dtype=torch.float64)
    # w = 1 - 2 pi + sum pi^2: row 0: 0.5, 0.5, 0.5 -> W = 0.5, 1.0, 1.5; row 1: 1 - 0.5 + 0.25 = 0.75,
    # (hole), 0.5 -> W = 0.75, -, 1.25. Returns-to-go: row 0: 1, 1, 1; row 1: 3, (0), 3.
    # B_0 = (1*0.5 + 3*0.75) / 1.25 = 2.2; B_1 = row 0 only = 1; B_2 = (1*1.5 + 3*1.25) / 2.75 = 21/11.
    # handle_zero_tail: at t=1 row 0 is its group's only valid row, so B_1 = 0 and A = G = 1 there.
    b1 = 0.0 if zero_tail else 1.0
    want = torch.tensor([[1 - 2.2, 1 - b1, 1 - 21 / 11], [3 - 2.2, 0.0, 3 - 21 / 11], [2.0, 2.0, 0.0]],
                        dtype=torch.float64)
    inp = AdvantageInput(rewards, mask, group_ids=groups, old_log_probs=pi.log(), sum_pi_squared=spi2)
    adv, ret = compute_advantages("optimal_token_baseline", inp, handle_zero_tail=zero_tail)
    torch.testing.assert_close(adv, want, rtol=1e-7, atol=1e-7)  # 1e-8 in the denominator
    torch.testing.assert_close(ret, torch.tensor([[1, 1, 1], [3, 0, 3], [2, 2, 0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="needs old_log_probs and sum_pi_squared"):
        compute_advantages("optimal_token_baseline", AdvantageInput(rewards, mask, group_ids=groups))


@pytest.mark.parametrize("zero_tail", [False, True])
def test_optimal_token_baseline_vectorised_equals_loop(gen, zero_tail):
    B, T = 30, 9
    mask = random_mask(B, T, gen, empty_rows=2).double()
    groups = torch.randint(0, 7, (B,), generator=gen)
    rewards = torch.randn(B, T, generator=gen, dtype=torch.float64) * (torch.rand(B, T, generator=gen) < 0.3)
    logp, spi2 = _otb_inputs(gen, B, T)
    want = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):  # per row and position, straight from the definition
        rows = (groups == groups[i]).nonzero().flatten().tolist()
        for t in range(T):
            if not mask[i, t]:
                continue

            def G(j, t=t):
                return float((rewards[j, t:] * mask[j, t:]).sum())

            def W(j, t=t):
                return float(((1 - 2 * logp[j, : t + 1].exp() + spi2[j, : t + 1]) * mask[j, : t + 1]).sum())

            valid = [j for j in rows if mask[j, t]]
            alone = len(rows) == 1 or (zero_tail and len(valid) == 1)  # no other row valid at t
            base = 0.0 if alone else sum(G(j) * W(j) for j in valid) / (sum(W(j) for j in valid) + 1e-8)
            want[i, t] = G(i) - base
    inp = AdvantageInput(rewards, mask, group_ids=groups, old_log_probs=logp, sum_pi_squared=spi2)
    adv, _ = compute_advantages("optimal_token_baseline", inp, handle_zero_tail=zero_tail)
    torch.testing.assert_close(adv, want, rtol=1e-10, atol=1e-10)


def test_sum_pi_squared_from_logits_hand_computed():
    from reinforge.algos.token_stats import sum_pi_squared_from_logits

    ln3 = torch.log(torch.tensor(3.0)).item()
    logits = torch.tensor([[0.0, 0.0, -1e4], [ln3, 0.0, -1e4], [2 * ln3, 0.0, -1e4]])
    # pi = (1/2, 1/2): 1/2; (3/4, 1/4): 5/8; the third row at temperature 2 equals the second.
    got = sum_pi_squared_from_logits(logits, temperature=1.0)
    torch.testing.assert_close(got[:2], torch.tensor([0.5, 0.625]))
    torch.testing.assert_close(sum_pi_squared_from_logits(logits[2:], temperature=2.0), torch.tensor([0.625]))
    # top-k = 1 keeps one token: sum pi^2 = 1.
    torch.testing.assert_close(sum_pi_squared_from_logits(logits[1:2], top_k=1), torch.tensor([1.0]))
