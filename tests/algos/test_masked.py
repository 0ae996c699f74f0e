import pytest
import torch

from reinforge.algos import masked_mean, masked_sum, masked_var, masked_whiten
from reinforge.algos.masked import masked_whiten_

from algos_helpers import random_mask


def test_hand_computed():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 6.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    assert masked_sum(x, m).item() == 13.0
    assert torch.equal(masked_sum(x, m, dim=-1), torch.tensor([3.0, 10.0]))
    assert masked_mean(x, m).item() == 13.0 / 4
    assert torch.equal(masked_mean(x, m, dim=-1), torch.tensor([1.5, 5.0]))
    # values 1, 2, 4, 6: mean 3.25, sum sq dev = 5.0625 + 1.5625 + 0.5625 + 7.5625 = 14.75
    assert torch.isclose(masked_var(x, m), torch.tensor(14.75 / 3))
    assert torch.isclose(masked_var(x, m, unbiased=False), torch.tensor(14.75 / 4))


def test_empty_mask_gives_zero_not_nan():
    x = torch.randn(3, 4, requires_grad=True)
    m = torch.zeros(3, 4)
    m[1, :2] = 1
    row = masked_mean(x, m, dim=-1)
    assert row[0] == 0 and row[2] == 0 and torch.isfinite(row).all()
    assert masked_mean(x, torch.zeros(3, 4)) == 0
    assert masked_var(x, torch.zeros(3, 4)) == 0
    (row.sum() + masked_mean(x, torch.zeros(3, 4))).backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad[0].abs().sum() == 0


def test_matches_loop(gen):
    x = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    m = random_mask(6, 9, gen)
    vals = [x[i, j].item() for i in range(6) for j in range(9) if m[i, j] > 0]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    assert abs(masked_mean(x, m).item() - mean) < 1e-12
    assert abs(masked_var(x, m).item() - var) < 1e-12
    for i in range(6):
        row = [x[i, j].item() for j in range(9) if m[i, j] > 0]
        expect = sum(row) / len(row) if row else 0.0
        assert abs(masked_mean(x, m, dim=-1)[i].item() - expect) < 1e-12


def test_whiten_mean0_var1(gen):
    x = 3 + 5 * torch.randn(8, 16, generator=gen, dtype=torch.float64)
    m = random_mask(8, 16, gen)
    w = masked_whiten(x, m)
    assert abs(masked_mean(w, m).item()) < 1e-10
    assert abs(masked_var(w, m).item() - 1) < 1e-6
    assert (w[m == 0] == 0).all()
    w2 = masked_whiten(x, m, shift_mean=False)
    assert abs(masked_mean(w2, m).item() - masked_mean(x, m).item()) < 1e-10


@pytest.mark.parametrize("shift_mean", [True, False])
def test_inplace_whiten_equals_whiten(gen, shift_mean):
    """masked_whiten_ (in place: writes into x) = masked_whiten, also for an empty or
    one-token mask, where both must stay finite."""
    x = 3 + 5 * torch.randn(8, 16, generator=gen, dtype=torch.float64)
    one = torch.zeros(8, 16, dtype=torch.float64)
    one[0, 3] = 1.0
    for m in (random_mask(8, 16, gen), torch.zeros_like(one), one):
        ref = masked_whiten(x, m, shift_mean=shift_mean)
        y = x.clone()
        out = masked_whiten_(y, m, shift_mean=shift_mean)
        assert out.data_ptr() == y.data_ptr()
        assert torch.isfinite(out).all()
        assert torch.allclose(out, ref, atol=1e-10)
