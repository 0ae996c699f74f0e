import math

import pytest
import torch

from reinforge.algos import (
    entropy_from_logits,
    entropy_from_logits_chunked,
    fused_logprobs_from_hidden,
    logprobs_and_entropy_from_logits,
    logprobs_from_logits,
)


def naive(logits, labels, T=1.0):
    logp = torch.log_softmax(logits / T, -1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def test_hand_computed():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = [0.25, 0.75]
    labels = torch.tensor([1])
    assert torch.allclose(logprobs_from_logits(logits, labels), torch.tensor([math.log(0.75)]))
    H = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert torch.allclose(entropy_from_logits(logits), torch.tensor([H]))
    assert torch.allclose(entropy_from_logits_chunked(logits), torch.tensor([H]))
    # temperature 2: logits / 2 -> p proportional to [1, sqrt(3)]
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    assert torch.allclose(logprobs_from_logits(logits, labels, temperature=2.0), torch.tensor([math.log(p1)]))


@pytest.mark.parametrize("T", [1.0, 0.7])
def test_matches_naive_with_grads(gen, T):
    full = torch.randn(3, 9, 50, generator=gen, dtype=torch.float64)
    logits = full[:, 2:7].requires_grad_(False)  # non-contiguous slice, like logits[:, -T-1:-1]
    x = logits.clone().requires_grad_(True)
    y = torch.randint(0, 50, (3, 5), generator=gen)
    lp, ent = logprobs_and_entropy_from_logits(x, y, T, chunk_size=4)
    lp_ref, ent_ref = naive(x, y, T)
    assert torch.allclose(lp, lp_ref, atol=1e-12) and torch.allclose(ent, ent_ref, atol=1e-12)
    w1, w2 = torch.randn(3, 5, generator=gen, dtype=torch.float64), torch.randn(3, 5, generator=gen, dtype=torch.float64)
    g = torch.autograd.grad((lp * w1 + ent * w2).sum(), x)[0]
    g_ref = torch.autograd.grad((lp_ref * w1 + ent_ref * w2).sum(), x)[0]
    assert torch.allclose(g, g_ref, atol=1e-12)
    # the non-contiguous view itself
    v = full.clone().requires_grad_(True)
    lp_v = logprobs_from_logits(v[:, 2:7], y, T, chunk_size=3)
    assert torch.allclose(lp_v, lp_ref.detach(), atol=1e-12)
    lp_v.sum().backward()
    g_full = torch.autograd.grad(naive(v[:, 2:7], y, T)[0].sum(), v)[0]
    assert torch.allclose(v.grad, g_full, atol=1e-12)


def test_gradcheck_logits(gen):
    x = torch.randn(2, 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 6, (2, 3), generator=gen)
    for T in (1.0, 1.3):
        assert torch.autograd.gradcheck(lambda a: logprobs_from_logits(a, y, T, chunk_size=2), (x,))
        assert torch.autograd.gradcheck(lambda a: logprobs_and_entropy_from_logits(a, y, T, chunk_size=4), (x,))
        assert torch.autograd.gradcheck(lambda a: entropy_from_logits_chunked(a, 5, T), (x,))


def test_bf16_logits_computed_in_fp32(gen):
    x = torch.randn(4, 100, generator=gen).bfloat16().requires_grad_(True)
    y = torch.randint(0, 100, (4,), generator=gen)
    lp, ent = logprobs_and_entropy_from_logits(x, y)
    lp_ref, ent_ref = naive(x.float(), y)
    assert lp.dtype == torch.float32 and torch.allclose(lp, lp_ref, atol=1e-5)
    assert torch.allclose(ent, ent_ref, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()


@pytest.mark.parametrize("T,with_ent", [(1.0, False), (0.8, True)])
def test_fused_matches_reference(gen, T, with_ent):
    N, H, V = 11, 8, 30
    h = torch.randn(N, H, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, V, (N,), generator=gen)
    lp, ent = fused_logprobs_from_hidden(h, w, y, temperature=T, chunk_size=4, return_entropy=with_ent)
    lp_ref, ent_ref = naive(h @ w.T, y, T)
    assert torch.allclose(lp, lp_ref, atol=1e-12)
    loss, loss_ref = lp.sum(), lp_ref.sum()
    if with_ent:
        assert torch.allclose(ent, ent_ref, atol=1e-12)
        loss, loss_ref = loss + 0.3 * ent.sum(), loss_ref + 0.3 * ent_ref.sum()
    else:
        assert ent is None
    g = torch.autograd.grad(loss, (h, w))
    g_ref = torch.autograd.grad(loss_ref, (h, w))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(g, g_ref))


@pytest.mark.parametrize("with_ent_grad", [False, True])
def test_fused_large_vocab_reusing_buffers_matches_reference(gen, with_ent_grad):
    """From LARGE_VOCAB ids the chunks reuse two (chunk, V) buffers and the entropy comes from the
    unnormalised exp(z - max): fp32 log-probs and entropies within 1e-5 of fp64 (the reference
    path's formula), gradients within 1e-5 of their norm, also when the entropy is returned
    but left out of the loss (its gradient terms are skipped, not fed zeros)."""
    from reinforge.algos.fused_logprobs import LARGE_VOCAB

    N, H, V = 13, 16, LARGE_VOCAB
    h = torch.randn(N, H, generator=gen, requires_grad=True)
    w = (torch.randn(V, H, generator=gen) * 0.5).requires_grad_()
    y = torch.randint(0, V, (N,), generator=gen)
    lp, ent = fused_logprobs_from_hidden(h, w, y, temperature=0.8, chunk_size=5, return_entropy=True)
    lp_ref, ent_ref = naive(h.double() @ w.double().T, y, 0.8)
    assert (lp - lp_ref).abs().max() < 1e-5 and (ent - ent_ref).abs().max() < 1e-5
    loss, loss_ref = lp.sum(), lp_ref.sum()
    if with_ent_grad:
        loss, loss_ref = loss + 0.3 * ent.sum(), loss_ref + 0.3 * ent_ref.sum()
    g = torch.autograd.grad(loss, (h, w))
    g_ref = torch.autograd.grad(loss_ref, (h, w))
    # dL/dh sums 65,536 fp32 terms per entry: ~1e-5 of its norm is fp32's own error there (the
    # former per-chunk path measures the same 0.8-1.2e-5, varying with the thread count), while
    # a wrong buffer reuse or entropy term is off by O(1)
    for a, b in zip(g, g_ref):
        assert (a.double() - b).norm() <= 5e-5 * b.norm()


def test_fused_gradcheck(gen):
    h = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 7, (5,), generator=gen)
    assert torch.autograd.gradcheck(lambda a, b: fused_logprobs_from_hidden(a, b, y, 1.0, 2)[0], (h, w))
    assert torch.autograd.gradcheck(
        lambda a, b: fused_logprobs_from_hidden(a, b, y, 0.9, 3, return_entropy=True), (h, w)
    )


def test_fused_bf16_matmuls_close_to_fp32(gen):
    """matmul_dtype=bf16 (the large-vocabulary head under bf16 autocast): log-probs and entropies
    within bf16 rounding of the logits (2^-7 x the largest |logit|), gradients within 2% of their
    norm, grad of the weight in fp32."""
    N, H, V = 24, 64, 1 << 16
    h = (torch.randn(N, H, generator=gen) * 0.5).requires_grad_()
    w = (torch.randn(V, H, generator=gen) * 0.5).requires_grad_()
    y = torch.randint(0, V, (N,), generator=gen)
    g_lp, g_ent = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    res = {}
    for md in (None, torch.bfloat16):
        lp, ent = fused_logprobs_from_hidden(h, w, y, temperature=0.9, chunk_size=7, return_entropy=True,
                                             matmul_dtype=md)
        res[md] = (lp, ent, *torch.autograd.grad((lp * g_lp + ent * g_ent).sum(), (h, w)))
    bound = 2.0 ** -7 * (h @ w.T).abs().max().item() / 0.9
    (lp32, ent32, gh32, gw32), (lp16, ent16, gh16, gw16) = res[None], res[torch.bfloat16]
    assert lp16.dtype == ent16.dtype == gw16.dtype == torch.float32
    assert (lp16 - lp32).abs().max() < bound and (ent16 - ent32).abs().max() < bound
    for a, b in ((gh16, gh32), (gw16, gw32)):
        assert (a - b).norm() < 0.02 * b.norm()


def test_bf16_head_gate():
    """The bf16 head switches on only under bf16 autocast, for an fp32 head of >= 65,536 ids."""
    from reinforge.algos.fused_logprobs import bf16_head

    assert not bf16_head(151936, torch.float32, "cpu")  # no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert bf16_head(151936, torch.float32, "cpu")
        assert not bf16_head(32000, torch.float32, "cpu") and not bf16_head(99, torch.float32, "cpu")
        assert not bf16_head(151936, torch.bfloat16, "cpu")
