"""The sampling filter (top-k, then top-p) applied to log-probs: the same kept set as
transformers' warpers, and log-probs, entropies and gradients of the renormalised distribution,
on the logits path and the fused path."""
from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from reinforge.algos.fused_logprobs import fused_logprobs_from_hidden
from reinforge.algos.logprobs import logprobs_and_entropy_from_logits, logprobs_from_logits, sampling_filter_

SETTINGS = [(5, 1.0), (0, 0.7), (7, 0.8), (40, 0.95)]


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_filter_keeps_what_transformers_keeps(top_k, top_p):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 40, generator=g) * 3
    ref = TemperatureLogitsWarper(0.7)(None, z.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    mine = z / 0.7
    removed = sampling_filter_(mine, top_k, top_p)
    assert torch.equal(removed, torch.isinf(ref))
    assert torch.equal(mine[~removed], ref[~removed])
    assert 0 < (~removed).sum(-1).min() and (removed.sum() > 0)


def _reference(logits, labels, T, top_k, top_p):
    """Plain autograd: log-softmax of the masked logits (labels kept), and its entropy."""
    z = logits / T
    with torch.no_grad():
        removed = sampling_filter_(z.detach().clone(), top_k, top_p, labels)
    z = z.masked_fill(removed, float("-inf"))
    logp_all = torch.log_softmax(z, -1)
    p = logp_all.exp()
    ent = -(p * logp_all.masked_fill(removed, 0.0)).sum(-1)
    return logp_all.gather(-1, labels[:, None]).squeeze(-1), ent


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_filtered_logprobs_entropy_and_gradients(top_k, top_p):
    g = torch.Generator().manual_seed(1)
    N, H, V, T = 24, 16, 40, 0.8
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, V, (N,), generator=g)  # many fall outside the kept set: kept anyway
    w_lp, w_ent = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)

    def grads(fn):
        lp, ent = fn()
        (lp * w_lp + ent * w_ent).sum().backward()
        out = (lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone())
        hidden.grad = weight.grad = None
        return out

    want = grads(lambda: _reference(hidden @ weight.T, labels, T, top_k, top_p))
    got_logits = grads(lambda: logprobs_and_entropy_from_logits(hidden @ weight.T, labels, T, 5, top_k, top_p))
    got_fused = grads(lambda: fused_logprobs_from_hidden(hidden, weight, labels, T, 7, True, top_k, top_p))
    for got in (got_logits, got_fused):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    only = logprobs_from_logits(hidden.detach() @ weight.detach().T, labels, T, None, top_k, top_p)
    torch.testing.assert_close(only, want[0], rtol=1e-12, atol=1e-12)


def test_no_filter_is_the_full_softmax():
    g = torch.Generator().manual_seed(2)
    logits, labels = torch.randn(10, 30, generator=g), torch.randint(0, 30, (10,), generator=g)
    full = torch.log_softmax(logits / 0.9, -1).gather(-1, labels[:, None]).squeeze(-1)
    assert torch.equal(logprobs_from_logits(logits, labels, 0.9, top_k=0, top_p=1.0),
                       logprobs_from_logits(logits, labels, 0.9))
    torch.testing.assert_close(logprobs_from_logits(logits, labels, 0.9, top_k=30, top_p=1.0), full)
