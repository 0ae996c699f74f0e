import math

import pytest
import torch
from algos_helpers import random_mask

from reinforge.algos import POLICY_LOSSES, get_policy_loss, masked_mean

KEYS = {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}


def test_ppo_clip_hand_computed():
    old = torch.zeros(1, 4)
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.5]])
    adv = torch.tensor([[1.0, -1.0, 2.0, 1.0]])
    lp = ratios.log().requires_grad_(True)
    m = torch.ones(1, 4)
    loss, met = get_policy_loss("ppo_clip")(lp, old, adv, m, clip_low=0.2, clip_high=0.3)
    # tok0: A>0, r=1.5 > 1.3 -> -1.3 (clipped); tok1: A<0, r=0.5 < 0.8 -> 0.8 (clipped)
    # tok2: -2.2; tok3: A>0, r=0.5 -> min objective is r*A -> loss -0.5 (not clipped)
    assert torch.allclose(loss, torch.tensor([[-1.3, 0.8, -2.2, -0.5]]))
    assert set(met) >= KEYS
    assert math.isclose(met["pg_clipfrac"].item(), 0.5)
    assert met["pg_clipfrac_lower"].item() == 0
    assert torch.isclose(met["ppo_kl"], -lp.detach().mean())
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert g[0, 0] == 0 and g[0, 1] == 0  # zero gradient through clipped tokens
    assert torch.isclose(g[0, 2], torch.tensor(-2.2)) and torch.isclose(g[0, 3], torch.tensor(-0.5))


def test_dual_clip():
    lp = torch.tensor([[math.log(5.0), math.log(2.0)]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[-1.0, -1.0]])
    loss, met = get_policy_loss("ppo_clip")(lp, old, adv, torch.ones(1, 2), clip_c=3.0)
    assert torch.allclose(loss, torch.tensor([[3.0, 2.0]]))  # r=5 capped at clip_c=3
    assert met["pg_clipfrac_lower"].item() == 0.5
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert g[0, 0] == 0 and torch.isclose(g[0, 1], torch.tensor(2.0))
    with pytest.raises(ValueError):
        get_policy_loss("ppo_clip")(lp, old, adv, torch.ones(1, 2), clip_c=0.5)


def test_ppo_matches_loop(gen):
    B, T = 5, 7
    lp = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3 - 1
    old = lp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    m = random_mask(B, T, gen).double()
    loss, _ = get_policy_loss("ppo_clip")(lp, old, adv, m, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    for b in range(B):
        for t in range(T):
            r, a = math.exp(lp[b, t] - old[b, t]), adv[b, t].item()
            x = max(-a * r, -a * min(max(r, 0.8), 1.28))
            if a < 0:
                x = min(x, -a * 3.0)
            assert abs(loss[b, t].item() - (x if m[b, t] else 0.0)) < 1e-12


def test_gspo_sequence_ratio_and_token_gradient():
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -2.1, -9.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.ones(1, 3)
    loss, met = get_policy_loss("gspo")(lp, old, adv, m, clip_low=0.5, clip_high=0.5)
    s = math.exp((0.2 + 0.1) / 2)
    assert torch.allclose(loss, torch.tensor([[-s, -s, 0.0]]))
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert torch.allclose(g, torch.tensor([[-s, -s, 0.0]]))  # each token: d(sg(s) e^{lp - sg lp}) = s
    # clipped sequence: zero gradient on all its tokens
    loss2, met2 = get_policy_loss("gspo")(lp, old, adv, m, clip_low=1e-3, clip_high=1e-3)
    (g2,) = torch.autograd.grad(loss2.sum(), lp)
    assert g2.abs().sum() == 0 and met2["pg_clipfrac"].item() == 1.0


def test_cispo():
    lp = torch.tensor([[math.log(2.0), math.log(0.9)]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    loss, met = get_policy_loss("cispo")(lp, old, adv, torch.ones(1, 2), clip_low=1.0, clip_high=0.3)
    w = torch.tensor([[1.3, 0.9]])
    assert torch.allclose(loss, -adv * w * lp.detach())
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert torch.allclose(g, -adv * w)  # clipped token still has a gradient (weight is stop-grad)
    assert met["pg_clipfrac"].item() == 0.5 and met["pg_clipfrac_lower"].item() == 0


def test_gmpo():
    lp = torch.tensor([[0.1, 1.0, 0.0], [0.0, -1.0, 0.3]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, met = get_policy_loss("gmpo")(lp, old, adv, m, clip_low=0.4, clip_high=0.4)
    s0 = math.exp((0.1 + 0.4) / 2)  # token 1 clipped at +0.4 (A > 0)
    s1 = math.exp((0.0 - 0.4 + 0.3) / 3)  # token 1 clipped at -0.4 (A < 0)
    assert torch.allclose(loss, torch.tensor([[-s0, -s0, 0.0], [s1, s1, s1]]))
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert g[0, 1] == 0 and g[1, 1] == 0 and g[0, 0] != 0
    assert math.isclose(met["pg_clipfrac"].item(), 2 / 5, rel_tol=1e-6)


def test_vanilla():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    loss, _ = get_policy_loss("vanilla")(lp, lp.detach(), adv, torch.ones(1, 2))
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert torch.allclose(loss, -adv) and torch.allclose(g, -adv)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_all_losses_common_contract(name, gen):
    B, T = 4, 6
    lp = (torch.randn(B, T, generator=gen) - 1).requires_grad_(True)
    old = lp.detach() + 0.1 * torch.randn(B, T, generator=gen)
    old[0, 0] = 80.0  # extreme log-ratio: clamped, stays finite
    adv = torch.randn(B, T, generator=gen)
    m = random_mask(B, T, gen)
    loss, met = get_policy_loss(name)(lp, old, adv, m)
    assert loss.shape == (B, T) and torch.isfinite(loss).all()
    assert (loss[m == 0] == 0).all() and set(met) >= KEYS
    assert all(torch.isfinite(v) and v.dim() == 0 for v in met.values())
    assert torch.isclose(met["ppo_kl"], masked_mean(old - lp.detach(), m))
    loss.sum().backward()
    assert torch.isfinite(lp.grad).all() and (lp.grad[m == 0] == 0).all()


def test_unknown_name():
    with pytest.raises(ValueError, match="ppo_clip"):
        get_policy_loss("trpo")
