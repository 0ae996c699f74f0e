import math

import pytest
import torch
from algos_helpers import random_mask

from reinforge.algos import (
    ADVANTAGE_ESTIMATORS,
    NEEDS_BASELINE,
    NEEDS_GROUPS,
    NEEDS_VALUES,
    AdvantageInput,
    compute_advantages,
    get_advantage_estimator,
    masked_mean,
    masked_var,
    masked_whiten,
)


def classic_gae(rewards, values, mask, gamma, lam):
    """The seed's per-time-step loop (lam may be a (B,) tensor), without whitening."""
    nextvalues = 0
    lastgaelam = 0
    out = []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        out.append(lastgaelam)
    adv = torch.stack(out[::-1], dim=1)
    return adv, adv + values


def make_batch(gen, B=9, T=13, dtype=torch.float64):
    mask = random_mask(B, T, gen, empty_rows=1).to(dtype)
    rewards = torch.randn(B, T, generator=gen, dtype=dtype) * (torch.rand(B, T, generator=gen) < 0.3)
    values = torch.randn(B, T, generator=gen, dtype=dtype)
    return rewards, values, mask


def test_gae_hand_computed():
    # one sequence, 3 tokens, gamma = 1, lam = 0.5, V = [1, 2, 3], reward 1 at the end
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[1.0, 2.0, 3.0]])
    m = torch.ones(1, 3)
    adv, ret = get_advantage_estimator("gae")(AdvantageInput(r, m, values=v, lam=0.5, whiten=False))
    # deltas: d2 = 1 - 3 = -2, d1 = 0 + 3 - 2 = 1, d0 = 0 + 2 - 1 = 1
    # A2 = -2, A1 = 1 + 0.5 * -2 = 0, A0 = 1 + 0.5 * 0 = 1
    assert torch.allclose(adv, torch.tensor([[1.0, 0.0, -2.0]]))
    assert torch.allclose(ret, torch.tensor([[2.0, 2.0, 1.0]]))


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.5)])
def test_gae_matches_classic_loop(gen, gamma, lam):
    r, v, m = make_batch(gen, B=9, T=70)
    adv, ret = compute_advantages("gae", AdvantageInput(r, m, values=v, gamma=gamma, lam=lam, whiten=False))
    ref_adv, ref_ret = classic_gae(r, v, m, gamma, lam)
    assert (adv - ref_adv).abs().max() <= 1e-6 and (ret - ref_ret).abs().max() <= 1e-6
    white, _ = compute_advantages("gae", AdvantageInput(r, m, values=v, gamma=gamma, lam=lam))
    assert torch.allclose(white, masked_whiten(ref_adv, m), atol=1e-6)


def test_gae_row_blocks_match_loop(gen, monkeypatch):
    """The scan goes over rows in blocks; several blocks (the last one short) give the loop's
    result, with both lambdas (VAPO) and a length-adaptive actor lambda."""
    import reinforge.algos.advantages as advantages

    monkeypatch.setattr(advantages, "_SCAN_BLOCK_ELEMENTS", 3 * 96)  # 3 rows of width 96 a block
    r, v, m = make_batch(gen, B=10, T=70)
    inp = AdvantageInput(r, m, values=v, gamma=0.99, lam=0.9, lam_critic=1.0, whiten=False)
    adv, ret = compute_advantages("gae", inp)
    ref_adv, _ = classic_gae(r, v, m, 0.99, 0.9)
    ref_crit, _ = classic_gae(r, v, m, 0.99, 1.0)
    assert (adv - ref_adv).abs().max() <= 1e-6
    assert (ret - (ref_crit + v)).abs().max() <= 1e-6
    lam_rows = (1 - 1 / (0.05 * m.sum(-1))).clamp(0, 1)
    adv, _ = compute_advantages("gae", AdvantageInput(r, m, values=v, gamma=0.99, length_adaptive_alpha=0.05, whiten=False))
    assert (adv - classic_gae(r, v, m, 0.99, lam_rows)[0]).abs().max() <= 1e-6


def test_gae_float32_close_to_loop(gen):
    r, v, m = make_batch(gen, B=16, T=200, dtype=torch.float32)
    adv, _ = compute_advantages("gae", AdvantageInput(r, m, values=v, gamma=0.99, lam=0.95, whiten=False))
    ref, _ = classic_gae(r.double(), v.double(), m.double(), 0.99, 0.95)
    assert float32_gap(adv, ref) <= 1e-5


def float32_gap(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| relative to max |ref|: a float32 scan's rounding error (measured ~3e-7 on
    every CPU kernel set) grows with the advantages' scale, not to a fixed absolute amount."""
    return float((x.double() - ref).abs().max() / ref.abs().max())


def test_gae_decoupled_and_length_adaptive(gen):
    r, v, m = make_batch(gen, B=10, T=60)
    alpha = 0.05
    inp = AdvantageInput(r, m, values=v, gamma=1.0, lam=0.9, lam_critic=1.0,
                         length_adaptive_alpha=alpha, whiten=False)
    adv, ret = compute_advantages("gae", inp)
    lengths = m.sum(-1)
    lam_rows = torch.tensor([min(max(1 - 1 / (alpha * L), 0.0), 1.0) if L > 0 else 0.0 for L in lengths.tolist()],
                            dtype=r.dtype)
    ref_adv, _ = classic_gae(r, v, m, 1.0, lam_rows)
    _, ref_ret = classic_gae(r, v, m, 1.0, 1.0)
    assert (adv - ref_adv).abs().max() <= 1e-6
    assert (ret - ref_ret).abs().max() <= 1e-6
    # decoupled only: actor lam 0.95, critic lam 1.0
    adv2, ret2 = compute_advantages("gae", AdvantageInput(r, m, values=v, lam=0.95, lam_critic=1.0, whiten=False))
    assert torch.allclose(adv2, classic_gae(r, v, m, 1.0, 0.95)[0], atol=1e-6)
    assert torch.allclose(ret2, ref_ret, atol=1e-6)


def shuffled_groups(gen, sizes):
    ids = torch.cat([torch.full((n,), 100 + 7 * g) for g, n in enumerate(sizes)])
    return ids[torch.randperm(len(ids), generator=gen)]


def group_batch(gen, sizes=(4, 1, 3, 6, 2), T=8):
    ids = shuffled_groups(gen, sizes)
    B = len(ids)
    mask = random_mask(B, T, gen, empty_rows=0).double()
    mask[:, 0] = 1.0  # every response has at least one token
    rewards = torch.zeros(B, T, dtype=torch.float64)
    last = (mask * torch.arange(T)).argmax(-1)
    rewards[torch.arange(B), last] = torch.randint(0, 3, (B,), generator=gen).double()
    return rewards, mask, ids


def loop_group_advantages(scores, ids, kind, lengths=None, eps=1e-6, norm_by_std=True):
    out = torch.zeros_like(scores)
    for i in range(len(scores)):
        members = [j for j in range(len(scores)) if ids[j] == ids[i]]
        vals = [scores[j].item() for j in members]
        n = len(vals)
        mean = sum(vals) / n
        if kind == "grpo":
            if n == 1:
                out[i] = 0.0
                continue
            std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (n - 1))
            out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
        elif kind == "rloo":
            out[i] = 0.0 if n == 1 else scores[i] - (sum(vals) - scores[i].item()) / (n - 1)
        elif kind == "mean":
            out[i] = scores[i] - mean
        elif kind == "opo":
            ls = [lengths[j].item() for j in members]
            out[i] = scores[i] - sum(l * x for l, x in zip(ls, vals)) / sum(ls)
    return out


@pytest.mark.parametrize("name,kind,kwargs", [
    ("grpo", "grpo", {}),
    ("grpo", "grpo", {"norm_by_std": False}),
    ("rloo", "rloo", {}),
    ("opo", "opo", {}),
])
def test_group_estimators_match_loop(gen, name, kind, kwargs):
    r, m, ids = group_batch(gen)
    adv, ret = compute_advantages(name, AdvantageInput(r, m, group_ids=ids, **kwargs))
    scores = (r * m).sum(-1)
    seq = loop_group_advantages(scores, ids, kind, lengths=m.sum(-1), **kwargs)
    assert (adv - seq[:, None] * m).abs().max() <= 1e-6
    assert torch.equal(adv, ret)
    assert torch.isfinite(adv).all()


def test_grpo_hand_computed_and_sums_to_zero(gen):
    r = torch.zeros(5, 2)
    r[:, 1] = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0])
    m = torch.ones(5, 2)
    ids = torch.tensor([3, 3, 9, 9, 4])  # group 4 is a singleton
    adv, _ = compute_advantages("grpo", AdvantageInput(r, m, group_ids=ids, eps=0.0))
    s = 1 / math.sqrt(2)  # (1 - 0.5) / std([1, 0]) = 0.5 / 0.7071
    assert torch.allclose(adv[:, 0], torch.tensor([s, -s, s, -s, 0.0]), atol=1e-6)
    r2, m2, ids2 = group_batch(gen)
    adv2, _ = compute_advantages("grpo", AdvantageInput(r2, m2, group_ids=ids2))
    seq = adv2[:, 0]
    for g in ids2.unique():
        assert abs(seq[ids2 == g].sum().item()) < 1e-9


def test_reinforce_plus_plus(gen):
    r, _, m = make_batch(gen, B=7, T=20)
    adv, ret = compute_advantages("reinforce_plus_plus", AdvantageInput(r, m, gamma=0.9))
    ref = torch.zeros_like(r)
    for b in range(r.shape[0]):
        g = 0.0
        for t in reversed(range(r.shape[1])):
            if m[b, t] > 0:
                g = r[b, t].item() + 0.9 * g
                ref[b, t] = g
    assert torch.allclose(ret, ref, atol=1e-9)
    assert torch.allclose(adv, masked_whiten(ref, m), atol=1e-9)
    assert abs(masked_mean(adv, m).item()) < 1e-9 and abs(masked_var(adv, m).item() - 1) < 1e-6


def test_reinforce_plus_plus_baseline(gen):
    r, m, ids = group_batch(gen)
    adv, _ = compute_advantages("reinforce_plus_plus_baseline", AdvantageInput(r, m, group_ids=ids))
    seq = loop_group_advantages((r * m).sum(-1), ids, "mean")
    assert torch.allclose(adv, masked_whiten(seq[:, None] * m, m), atol=1e-9)


def test_remax():
    r = torch.tensor([[0.0, 2.0], [1.0, 0.0]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, _ = compute_advantages("remax", AdvantageInput(r, m, baseline_rewards=torch.tensor([0.5, 1.0])))
    assert torch.allclose(adv, torch.tensor([[1.5, 1.5], [0.0, 0.0]]))


def test_requirements_and_unknown_names():
    r, m = torch.zeros(2, 3), torch.ones(2, 3)
    assert NEEDS_VALUES == {"gae"} and "grpo" in NEEDS_GROUPS and NEEDS_BASELINE == {"remax"}
    assert (NEEDS_VALUES | NEEDS_GROUPS | NEEDS_BASELINE) <= set(ADVANTAGE_ESTIMATORS)
    for name in NEEDS_VALUES | NEEDS_GROUPS | NEEDS_BASELINE:
        with pytest.raises(ValueError):
            compute_advantages(name, AdvantageInput(r, m))
    with pytest.raises(ValueError, match="grpo"):
        get_advantage_estimator("ppo")


def test_reinforce_without_baseline_hand_computed():
    """Plain REINFORCE: each valid token carries its sequence's score; nothing is pushed down
    for a zero score (0/1 rewards make it rejection-sampling fine-tuning)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv, ret = compute_advantages("reinforce", AdvantageInput(rewards, mask))
    assert adv.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]]
    assert torch.equal(adv, ret)


@pytest.mark.parametrize("T,chunk", [(1, 4), (7, 4), (33, 8), (300, 32), (300, 4), (50, 3)])
def test_discounted_reverse_cumsum_matches_loop(T, chunk):
    from reinforge.algos.scan import discounted_reverse_cumsum

    g = torch.Generator().manual_seed(T)
    b = torch.randn(4, T, generator=g, dtype=torch.float64)
    c = torch.tensor([0.0, 0.5, 0.95, 1.0], dtype=torch.float64)
    ref = torch.zeros_like(b)
    acc = torch.zeros(4, dtype=torch.float64)
    for t in reversed(range(T)):
        acc = b[:, t] + c * acc
        ref[:, t] = acc
    assert torch.allclose(discounted_reverse_cumsum(b, c, chunk=chunk), ref, atol=1e-10)


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_gae_full_precision_under_fast_matmul_modes(gen, precision, monkeypatch):
    """The chunk solves are matmuls; with TF32/bf16 matmuls switched on (common on GPUs) GAE
    runs every one of them at "highest" precision and restores the caller's setting after.
    (On this CPU the fast modes change no bmm result, so the test watches the setting that
    each bmm call sees.)"""
    r, v, m = make_batch(gen, B=8, T=300, dtype=torch.float32)
    inp = AdvantageInput(r, m, values=v, gamma=0.99, lam=0.95, lam_critic=1.0, whiten=False)
    seen, bmm = [], torch.bmm

    def recording_bmm(*args, **kwargs):
        seen.append(torch.get_float32_matmul_precision())
        return bmm(*args, **kwargs)

    monkeypatch.setattr(torch, "bmm", recording_bmm)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        adv, _ = compute_advantages("gae", inp)
        assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen and set(seen) == {"highest"}
    assert float32_gap(adv, classic_gae(r.double(), v.double(), m.double(), 0.99, 0.95)[0]) <= 1e-5
