import math

import pytest
import torch

from reinforge.algos import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_full,
    kl_penalty,
    make_kl_controller,
)


def test_hand_computed():
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    assert torch.allclose(kl_penalty(lp, ref, "k1"), torch.tensor([[0.5, -1.0]]))
    assert torch.allclose(kl_penalty(lp, ref, "kl"), torch.tensor([[0.5, -1.0]]))
    assert torch.allclose(kl_penalty(lp, ref, "abs"), torch.tensor([[0.5, 1.0]]))
    assert torch.allclose(kl_penalty(lp, ref, "k2"), torch.tensor([[0.125, 0.5]]))
    assert torch.allclose(kl_penalty(lp, ref, "mse"), torch.tensor([[0.125, 0.5]]))
    k3 = torch.tensor([[math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]])
    assert torch.allclose(kl_penalty(lp, ref, "k3"), k3)
    assert torch.allclose(kl_penalty(lp, ref, "low_var_kl"), k3)


def test_k3_clamps():
    lp = torch.tensor([0.0, 0.0, 0.0], requires_grad=True)
    ref = torch.tensor([-100.0, 100.0, -1.0])
    out = kl_penalty(lp, ref, "k3")
    # log(pi_ref/pi) = -100 and 100 are clamped to -/+20, then k3 (19 and e^20 - 21) to 10; -1 is
    # in range: e^-1 + 1 - 1.
    assert torch.equal(out[:2].detach(), torch.tensor([10.0, 10.0]))
    assert out[2].item() == pytest.approx(math.exp(-1.0), abs=1e-6)  # float32: 1 + e^-1 rounds by up to 6e-8
    # The forward value would be the same without the log-ratio clamp (the result clamp hides
    # exp(100) = inf), but the backward would not: d/dx exp(x) = inf times the result clamp's
    # zero gradient is NaN. With the clamps the saturated tokens get a zero gradient, and the
    # in-range token d/dlp [exp(ref - lp) - (ref - lp) - 1] = 1 - exp(ref - lp).
    (g,) = torch.autograd.grad(out.sum(), lp)
    assert torch.isfinite(g).all(), g
    assert g[0].item() == 0.0 and g[1].item() == 0.0
    assert g[2].item() == pytest.approx(1 - math.exp(-1.0), abs=1e-6)


@pytest.mark.parametrize("name,base", [("k1+", "k1"), ("k3+", "k3")])
def test_straight_through(name, base):
    lp = torch.tensor([-1.0, -0.3, -2.0], requires_grad=True)
    ref = torch.tensor([-1.4, -0.1, -2.0])
    out = kl_penalty(lp, ref, name)
    assert torch.allclose(out, kl_penalty(lp, ref, base))
    (g,) = torch.autograd.grad(out.sum(), lp)
    assert torch.allclose(g, (lp - ref).detach())  # gradient of k2


def test_full_kl():
    p = torch.log_softmax(torch.randn(2, 3, 5), -1)
    q = torch.log_softmax(torch.randn(2, 3, 5), -1)
    expect = torch.nn.functional.kl_div(q, p, reduction="none", log_target=True).sum(-1)
    assert torch.allclose(kl_full(p, q), expect, atol=1e-6)
    assert torch.allclose(kl_penalty(p, q, "full"), expect, atol=1e-6)
    assert torch.allclose(kl_full(p, p), torch.zeros(2, 3), atol=1e-6)


def test_unknown_estimator():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k9")
    assert {"k1", "k2", "k3", "abs", "full", "k1+", "k3+"} <= set(KL_ESTIMATORS)


def test_controllers():
    fixed = make_kl_controller("fixed", 0.1)
    fixed.update(5.0, 10)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.1
    ad = make_kl_controller("adaptive", 0.1, target_kl=1.0, horizon=100)
    assert isinstance(ad, AdaptiveKLController)
    ad.update(current_kl=5.0, n_steps=10)  # error clipped to 0.2
    assert math.isclose(ad.value, 0.1 * (1 + 0.2 * 10 / 100))
    ad.update(current_kl=0.9, n_steps=10)  # error -0.1
    v = 0.1 * 1.02 * (1 - 0.1 * 10 / 100)
    assert math.isclose(ad.value, v)
    other = AdaptiveKLController(1.0, 2.0, 5)
    other.load_state_dict(ad.state_dict())
    assert other.value == ad.value and other.target_kl == 1.0 and other.horizon == 100
    with pytest.raises(ValueError, match="adaptive"):
        make_kl_controller("pid", 0.1)
    with pytest.raises(ValueError):
        make_kl_controller("adaptive", 0.1)
