"""The breadth estimators of issue 16: GRPO pass@k and GPG (veRL ``grpo_passk``, ``gpg``).

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
    # Scores from a small set so that ties (at the top and elsewhere) occur.
    rewards = torch.randint(0, 3, (B, T), generator=gen).double() * 0.5 * (torch.rand(B, T, generator=gen) < 0.3)
    s = (rewards * mask).sum(-1)
    for name, want in (("grpo_passk", _loop_passk(s, groups, norm, 1e-6)), ("gpg", _loop_gpg(s, groups))):
        adv = _run(name, rewards, mask, groups, norm_by_std=norm)
        torch.testing.assert_close(adv, want[:, None] * mask, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("name", ["grpo_passk", "gpg"])
def test_needs_groups(name):
    assert name in NEEDS_GROUPS
    with pytest.raises(ValueError, match="needs group_ids"):
        compute_advantages(name, AdvantageInput(torch.zeros(2, 3), torch.ones(2, 3)))
