import math

import pytest
import torch
import torch.nn.functional as F

from reinforge.algos import (
    bradley_terry_loss,
    clipped_value_loss,
    dpo_loss,
    explained_variance,
    sequence_logps,
    soft_overlong_penalty,
)


def test_clipped_value_loss_hand_computed():
    vpred = torch.tensor([[2.0, 0.0]], requires_grad=True)
    old = torch.tensor([[1.0, 0.0]])
    ret = torch.tensor([[0.0, 1.0]])
    m = torch.ones(1, 2)
    loss, met = clipped_value_loss(vpred, old, ret, m, cliprange_value=0.5)
    # tok0: unclipped (2-0)^2=4, clipped 1.5^2=2.25 -> 4; tok1: 1 vs 1 -> 1
    assert torch.isclose(loss, torch.tensor(0.5 * (4 + 1) / 2))
    assert met["vf_clipfrac"].item() == 0
    vpred2 = torch.tensor([[2.0, 0.0]], requires_grad=True)
    ret2 = torch.tensor([[3.0, 0.0]])  # tok0: unclipped 1, clipped (1.5-3)^2 = 2.25 -> clipped wins
    loss2, met2 = clipped_value_loss(vpred2, old, ret2, m, cliprange_value=0.5)
    assert torch.isclose(loss2, torch.tensor(0.5 * 2.25 / 2)) and met2["vf_clipfrac"].item() == 0.5
    loss2.backward()
    assert vpred2.grad[0, 0] == 0  # gradient blocked through the clipped prediction
    loss3, met3 = clipped_value_loss(vpred, old, ret, m, None, agg_mode="seq-mean-token-sum")
    assert torch.isclose(loss3, torch.tensor(0.5 * 5.0)) and met3["vf_clipfrac"] == 0


def test_explained_variance():
    t = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert torch.isclose(explained_variance(t, t, m), torch.tensor(1.0))
    assert torch.isclose(explained_variance(torch.full_like(t, 2.0), t, m), torch.tensor(0.0))
    p = torch.tensor([[1.0, 2.0, 4.0, 0.0]])  # residuals 0, 0, -1: var 2/9; var(t) = 2/3
    assert torch.isclose(explained_variance(p, t, m), torch.tensor(1 - (2 / 9) / (2 / 3)))
    assert explained_variance(t, torch.ones_like(t), m) == 0


def test_explained_variance_moments_add_up_over_parts():
    """The critic sums moments over micro-batches and ranks: any split gives the whole batch's
    explained variance."""
    from reinforge.algos.value_loss import explained_variance_from_moments, explained_variance_moments

    g = torch.Generator().manual_seed(0)
    t = torch.randn(6, 9, generator=g, dtype=torch.float64)
    p = t + 0.5 * torch.randn(6, 9, generator=g, dtype=torch.float64)
    m = (torch.rand(6, 9, generator=g) < 0.7).double()
    parts = [explained_variance_moments(p[i:j], t[i:j], m[i:j]) for i, j in ((0, 1), (1, 4), (4, 6))]
    total = {k: sum(part[k] for part in parts) for k in parts[0]}
    assert torch.isclose(explained_variance_from_moments(total), explained_variance(p, t, m), atol=1e-12)


def test_sequence_logps():
    lp = torch.tensor([[-1.0, -2.0, -5.0], [-1.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(sequence_logps(lp, m), torch.tensor([-3.0, 0.0]))
    assert torch.equal(sequence_logps(lp, m, "mean"), torch.tensor([-1.5, 0.0]))
    with pytest.raises(ValueError):
        sequence_logps(lp, m, "max")


def test_dpo_variants():
    pc, pr = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])
    rc, rr = torch.tensor([-1.5, -1.5]), torch.tensor([-1.5, -1.5])
    z = torch.tensor([1.0, -1.0])
    loss, met = dpo_loss(pc, pr, rc, rr, beta=0.5)
    assert torch.isclose(loss, -F.logsigmoid(0.5 * z).mean())
    loss_ls, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, label_smoothing=0.1)
    expect = (-0.9 * F.logsigmoid(0.5 * z) - 0.1 * F.logsigmoid(-0.5 * z)).mean()
    assert torch.isclose(loss_ls, expect)
    ipo, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, loss_type="ipo")
    assert torch.isclose(ipo, ((z - 1.0) ** 2).mean())
    hinge, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, loss_type="hinge")
    assert torch.isclose(hinge, torch.relu(1 - 0.5 * z).mean())
    assert torch.isclose(met["rewards/chosen"], torch.tensor(0.5 * (0.5 - 0.5) / 2))
    assert torch.isclose(met["rewards/rejected"], torch.tensor(0.5 * (-0.5 + 0.5) / 2))
    assert met["rewards/accuracies"].item() == 0.5
    assert torch.isclose(met["rewards/margins"], (0.5 * z).mean())
    with pytest.raises(ValueError, match="sigmoid"):
        dpo_loss(pc, pr, rc, rr, loss_type="kto")


def test_robust_dpo_by_hand():
    # rDPO, beta 0.5, eps 0.2: [-(1 - eps) log sigma(beta z) + eps log sigma(-beta z)] / (1 - 2 eps).
    pc, pr = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])
    rc, rr = torch.tensor([-1.5, -1.5]), torch.tensor([-1.5, -1.5])  # z = [1, -1]
    ls = lambda x: -math.log1p(math.exp(-x))  # log sigma(x)
    per = [(-(0.8) * ls(0.5 * z) + 0.2 * ls(-0.5 * z)) / 0.6 for z in (1.0, -1.0)]
    loss, met = dpo_loss(pc, pr, rc, rr, beta=0.5, loss_type="robust", label_smoothing=0.2)
    assert loss.item() == pytest.approx(sum(per) / 2, abs=1e-6)  # [0.6918, 1.4211]
    assert met["rewards/accuracies"].item() == 0.5
    plain, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, loss_type="robust")
    assert torch.isclose(plain, -F.logsigmoid(0.5 * torch.tensor([1.0, -1.0])).mean())  # eps 0: DPO


def test_robust_dpo_gradient_is_the_unbiased_one():
    # d/dz of rDPO = -beta [(1 - eps) sigma(-beta z) + eps sigma(beta z)] / (1 - 2 eps), and its
    # expectation over a flip with probability eps is the clean DPO gradient -beta sigma(-beta z)
    # (the rDPO paper's point; cDPO's is not).
    beta, eps = 0.5, 0.2
    pc = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    zero = torch.zeros(3, dtype=torch.float64)
    loss, _ = dpo_loss(pc, zero, zero, zero, beta=beta, loss_type="robust", label_smoothing=eps)  # z = pc
    loss.backward()
    sig = lambda x: 1 / (1 + math.exp(-x))
    z = pc.detach().tolist()
    expected = [-beta * ((1 - eps) * sig(-beta * v) + eps * sig(beta * v)) / (1 - 2 * eps) / 3 for v in z]
    assert pc.grad.tolist() == pytest.approx(expected, rel=1e-12)
    flipped = [-beta * ((1 - eps) * sig(beta * v) + eps * sig(-beta * v)) / (1 - 2 * eps) / 3 for v in z]
    for g, f, v in zip(expected, flipped, z):  # the label flipped: z -> -z, d/dz -> -d/d(-z)
        assert (1 - eps) * g - eps * f == pytest.approx(-beta * sig(-beta * v) / 3, rel=1e-12)


def test_dpo_gradient_direction():
    pc = torch.tensor([-1.0], requires_grad=True)
    pr = torch.tensor([-1.0], requires_grad=True)
    loss, _ = dpo_loss(pc, pr, torch.tensor([-1.0]), torch.tensor([-1.0]), beta=0.1)
    assert math.isclose(loss.item(), math.log(2), rel_tol=1e-6)
    loss.backward()
    assert pc.grad < 0 and pr.grad > 0


def test_bradley_terry():
    loss, met = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))
    assert torch.isclose(loss, -(F.logsigmoid(torch.tensor(1.0)) + F.logsigmoid(torch.tensor(-1.0))) / 2)
    assert met["accuracy"].item() == 0.5 and met["margin"].item() == 0.0


def test_soft_overlong_penalty():
    L = torch.tensor([10, 16, 18, 20, 21, 100])
    out = soft_overlong_penalty(L, max_len=20, buffer_len=4, penalty_factor=2.0)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -1.0, -2.0, -2.0, -2.0]))
    with pytest.raises(ValueError):
        soft_overlong_penalty(L, max_len=20, buffer_len=0)
