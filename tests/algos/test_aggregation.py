import pytest
import torch

from reinforge.algos import AGG_MODES, agg_denominators, agg_loss

from algos_helpers import random_mask


def test_hand_computed():
    L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    # valid: row0 {1,2}, row1 {4,5,6}, row2 empty (does not count as a sequence)
    assert torch.isclose(agg_loss(L, m, "token-mean"), torch.tensor(18.0 / 5))
    assert torch.isclose(agg_loss(L, m, "seq-mean-token-sum"), torch.tensor((3.0 + 15.0) / 2))
    assert torch.isclose(agg_loss(L, m, "seq-mean-token-mean"), torch.tensor((1.5 + 5.0) / 2))
    assert torch.isclose(agg_loss(L, m, "seq-mean-token-sum-norm"), torch.tensor((3.0 / 3 + 15.0 / 3) / 2))
    assert torch.isclose(agg_loss(L, m, "seq-mean-token-sum-norm", norm_const=10), torch.tensor(18.0 / 10 / 2))
    d = agg_denominators(m)
    assert d["num_tokens"] == 5 and d["num_seqs"] == 2


def test_seq_mean_token_mean_does_not_raise_and_empty_is_zero():
    L = torch.randn(2, 3)
    for mode in AGG_MODES:
        out = agg_loss(L, torch.zeros(2, 3), mode)
        assert out == 0 and torch.isfinite(out)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_microbatch_accumulation_equals_minibatch(mode, gen):
    B, T = 12, 10
    L = torch.randn(B, T, generator=gen, dtype=torch.float64, requires_grad=True)
    m = random_mask(B, T, gen, empty_rows=2)
    full = agg_loss(L, m, mode)
    (g_full,) = torch.autograd.grad(full, L)
    counts = agg_denominators(m)
    total = 0.0
    for idx in torch.randperm(B, generator=gen).split([5, 4, 3]):  # unequal micro-batches
        total = total + agg_loss(L[idx], m[idx], mode, **counts)
    (g_micro,) = torch.autograd.grad(total, L)
    assert torch.allclose(total, full, atol=1e-12)
    assert torch.allclose(g_micro, g_full, atol=1e-12)


def test_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(torch.zeros(1, 1), torch.ones(1, 1), "bogus")
