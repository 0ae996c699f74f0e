"""algos/distill.py: reverse-KL advantages and GKD's generalised JSD, by hand and chunked."""
import math

import pytest
import torch

from reinforge.algos.distill import (chunked_distill_from_hidden, distill_advantages, generalized_jsd,
                                     reverse_kl_tokens)


def test_reverse_kl_and_advantages_by_hand():
    s = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.1, -3.0]])
    t = torch.tensor([[-1.5, -1.0, -3.0], [-0.2, -2.1, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    k = reverse_kl_tokens(s, t, mask)
    assert torch.allclose(k, torch.tensor([[0.5, -1.0, 0.0], [0.0, 2.0, -2.9]]))
    assert torch.allclose(distill_advantages(s, t, mask), -k)
    # return-to-go: sum of -k_s over s >= t, nothing from the padding
    assert torch.allclose(distill_advantages(s, t, mask, return_to_go=True),
                          torch.tensor([[0.5, 1.0, 0.0], [0.9, 0.9, 2.9]]))


def _logits(probs):
    return torch.tensor(probs, dtype=torch.float64).log()


def test_jsd_by_hand():
    p, q, beta = [0.5, 0.5], [0.9, 0.1], 0.3
    m = [beta * a + (1 - beta) * b for a, b in zip(p, q)]
    kl_pm = sum(a * math.log(a / c) for a, c in zip(p, m))
    kl_qm = sum(b * math.log(b / c) for b, c in zip(q, m))
    want = beta * kl_pm + (1 - beta) * kl_qm
    got = generalized_jsd(_logits([q]), _logits([p]), beta)
    assert got.shape == (1,) and abs(float(got[0]) - want) < 1e-12


def test_jsd_endpoints_are_forward_and_reverse_kl():
    torch.manual_seed(0)
    zs, zt = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    q, p = zs.softmax(-1), zt.softmax(-1)
    forward = (p * (p.log() - q.log())).sum(-1)  # KL(teacher || student)
    reverse = (q * (q.log() - p.log())).sum(-1)  # KL(student || teacher)
    assert torch.allclose(generalized_jsd(zs, zt, 0.0), forward, atol=1e-12)
    assert torch.allclose(generalized_jsd(zs, zt, 1.0), reverse, atol=1e-12)
    # the general formula approaches them, scaled by beta and 1 - beta (so the endpoints are its limits)
    eps = 1e-5
    assert torch.allclose(generalized_jsd(zs, zt, eps) / eps, forward, rtol=1e-3)
    assert torch.allclose(generalized_jsd(zs, zt, 1 - eps) / eps, reverse, rtol=1e-3)


def test_jsd_gradient_by_hand():
    """d JSD / d z_student = (1 - beta) q * (g - <q, g>) with g = log(q / M)."""
    torch.manual_seed(1)
    zs = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    zt = torch.randn(4, 6, dtype=torch.float64)
    beta = 0.4
    generalized_jsd(zs, zt, beta).sum().backward()
    q, p = zs.detach().softmax(-1), zt.softmax(-1)
    g = (q / (beta * p + (1 - beta) * q)).log()
    want = (1 - beta) * q * (g - (q * g).sum(-1, keepdim=True))
    assert torch.allclose(zs.grad, want, atol=1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("chunk", [1, 3, None])
def test_chunked_matches_full_logits(beta, chunk):
    torch.manual_seed(2)
    N, H, Ht, V, temp = 7, 5, 3, 11, 0.7
    hs = torch.randn(N, H, dtype=torch.float64, requires_grad=True)
    ws = torch.randn(V, H, dtype=torch.float64, requires_grad=True)
    ht, wt = torch.randn(N, Ht, dtype=torch.float64), torch.randn(V, Ht, dtype=torch.float64)
    labels = torch.randint(0, V, (N,))
    g = [torch.randn(N, dtype=torch.float64) for _ in range(3)]

    jsd, logp, ent = chunked_distill_from_hidden(hs, ws, ht, wt, labels, beta, temp, chunk)
    (jsd @ g[0] + logp @ g[1] + ent @ g[2]).backward()
    got = hs.grad.clone(), ws.grad.clone()
    hs.grad = ws.grad = None

    zs, zt = hs @ ws.T / temp, ht @ wt.T / temp
    log_q = zs.log_softmax(-1)
    ref = (generalized_jsd(zs, zt, beta), log_q.gather(-1, labels[:, None])[:, 0], -(log_q.exp() * log_q).sum(-1))
    (ref[0] @ g[0] + ref[1] @ g[1] + ref[2] @ g[2]).backward()
    for a, b in zip((jsd, logp, ent), ref):
        assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(got[0], hs.grad, atol=1e-10) and torch.allclose(got[1], ws.grad, atol=1e-10)


def test_chunked_refuses_another_vocabulary():
    with pytest.raises(ValueError, match="vocabularies differ"):
        chunked_distill_from_hidden(torch.zeros(2, 3), torch.zeros(5, 3), torch.zeros(2, 3), torch.zeros(6, 3),
                                    torch.zeros(2, dtype=torch.long), 0.5)
