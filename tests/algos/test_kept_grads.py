"""algos/kept_grads.py: large gradients kept between steps, and the backward code that adds into them.

The size threshold is lowered so a small head qualifies; the values are compared with the
plain autograd path on an identical copy (bit for bit on a step's first micro-batch, where both
sum the same products in the same order onto zero)."""
import copy

import pytest
import torch

from reinforge.algos import kept_grads
from reinforge.algos.fused_logprobs import fused_logprobs_from_hidden

V, H, N = 211, 24, 37


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(kept_grads, "MIN_NUMEL", V * H)


def _head_loss(h, w, seed, md=None):
    labels = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(seed))
    logp, ent = fused_logprobs_from_hidden(h, w, labels, chunk_size=10, return_entropy=True, matmul_dtype=md)
    return -logp.sum() - 0.01 * ent.sum()


def test_release_keeps_only_large_gradients(small_threshold):
    big, small = torch.nn.Parameter(torch.randn(V, H)), torch.nn.Parameter(torch.randn(3))
    big.grad, small.grad = torch.ones(V, H), torch.ones(3)
    storage = big.grad.data_ptr()
    kept_grads.release([big, small])
    assert big.grad is None and small.grad is None
    assert kept_grads.grad_buffer(small) is None  # nothing kept: the caller makes a fresh one
    buf = kept_grads.grad_buffer(big)
    assert buf.data_ptr() == storage and big.grad is buf and buf.abs().max() == 0
    assert kept_grads.grad_buffer(big) is buf  # now p.grad itself: later micro-batches add into it


def test_a_deepcopy_carries_no_kept_gradient(small_threshold):
    """The asynchronous producer deep-copies the actor's module: the copy must not get (or share)
    a kept gradient."""
    model = torch.nn.Linear(H, V, bias=False)
    model.weight.grad = torch.ones(V, H)
    kept_grads.release(model.parameters())
    twin = copy.deepcopy(model)
    assert kept_grads.grad_buffer(twin.weight) is None and twin.weight.grad is None
    assert kept_grads.grad_buffer(model.weight) is not None


def test_unused_parameter_stays_without_gradient(small_threshold):
    """A kept tensor is installed only by backward code that adds into it: a parameter without a
    gradient this step keeps grad None, so AdamW skips it (no decay on a zero gradient)."""
    w = torch.nn.Parameter(torch.randn(V, H))
    w.grad = torch.randn(V, H)
    opt = torch.optim.AdamW([w], lr=0.1, weight_decay=0.5)
    kept_grads.release_optimizer(opt)
    before = w.detach().clone()
    opt.step()
    assert w.grad is None and torch.equal(w.detach(), before)


@pytest.mark.parametrize("md", [None, torch.bfloat16])
def test_fused_head_adds_into_the_kept_gradient(small_threshold, md):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(V, H) * 0.1)
    ref = copy.deepcopy(w)
    h = torch.randn(N, H)
    # step 1: no kept tensor yet, both take autograd's path
    _head_loss(h, w, 1, md).backward()
    _head_loss(h, ref, 1, md).backward()
    storage = w.grad.data_ptr()
    kept_grads.release([w])
    ref.grad = None
    # step 2: w's gradient goes into the kept tensor, ref's through autograd
    _head_loss(h, w, 2, md).backward()
    _head_loss(h, ref, 2, md).backward()
    assert w.grad.data_ptr() == storage
    assert torch.equal(w.grad, ref.grad)  # one micro-batch: the same sums onto zero
    # a second micro-batch adds into it (autograd adds the separate sum: rounding-level difference)
    _head_loss(h, w, 3, md).backward()
    _head_loss(h, ref, 3, md).backward()
    torch.testing.assert_close(w.grad, ref.grad, rtol=0, atol=1e-6 * ref.grad.abs().max().item())


def test_tied_model_steps_reuse_the_gradient_and_match_the_plain_model(small_threshold, monkeypatch):
    """A tied Qwen2 through load's tie_lookup and the update's release: from the second step on the
    embedding's gradient lives in the same memory, and every gradient is the plain model's."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import reinforge.models.tied_lookup as tl
    from reinforge.models.forward import response_logprobs

    monkeypatch.setattr(kept_grads, "MIN_NUMEL", 97 * 32)
    monkeypatch.setattr(tl, "MIN_NUMEL", 0)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=0)
    plain = Qwen2ForCausalLM(cfg)
    model = copy.deepcopy(plain)
    assert tl.tie_lookup(model)
    emb = model.get_input_embeddings().weight
    storages = []
    for step in range(3):
        ids = torch.randint(1, 97, (3, 10), generator=torch.Generator().manual_seed(step))
        mask = torch.ones_like(ids)
        for m in (plain, model):
            lp, _ = response_logprobs(m, ids, mask, 5)
            (-lp.sum()).backward()
        storages.append(emb.grad.data_ptr())
        for (name, p), q in zip(plain.named_parameters(), model.parameters()):
            assert (p.grad - q.grad).abs().max() <= 1e-5 * p.grad.abs().max(), (step, name)
        kept_grads.release(model.parameters())
        plain.zero_grad(set_to_none=True)
    assert storages[1] == storages[0] and storages[2] == storages[0]
