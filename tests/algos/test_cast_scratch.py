"""algos/cast_scratch: large casts into a reused per-thread buffer, never two live copies in one."""
import threading

import torch

from reinforge.algos import cast_scratch
from reinforge.algos.fused_logprobs import fused_logprobs_from_hidden


def test_small_tensor_is_a_plain_cast():
    t = torch.randn(4, 3)
    out = cast_scratch.cast(t, torch.bfloat16)
    assert torch.equal(out, t.to(torch.bfloat16))
    cast_scratch.give_back(out)  # not lent: nothing happens


def test_large_cast_reuses_its_buffer_and_never_shares_a_live_one(monkeypatch):
    monkeypatch.setattr(cast_scratch, "MIN_NUMEL", 16)
    a, b = torch.randn(8, 4), torch.randn(8, 4)
    x = cast_scratch.cast(a, torch.bfloat16)
    y = cast_scratch.cast(b, torch.bfloat16)  # x is still lent: y is a fresh tensor
    assert x.data_ptr() != y.data_ptr()
    assert torch.equal(x, a.to(torch.bfloat16)) and torch.equal(y, b.to(torch.bfloat16))
    cast_scratch.give_back(x)
    z = cast_scratch.cast(b, torch.bfloat16)  # returned: the same buffer, with b's values
    assert z.data_ptr() == x.data_ptr() and torch.equal(z, b.to(torch.bfloat16))
    cast_scratch.give_back(z)


def test_buffers_are_per_thread(monkeypatch):
    monkeypatch.setattr(cast_scratch, "MIN_NUMEL", 16)
    t = torch.randn(8, 4)
    mine = cast_scratch.cast(t, torch.bfloat16)
    cast_scratch.give_back(mine)
    other = {}
    th = threading.Thread(target=lambda: other.setdefault("ptr", cast_scratch.cast(t, torch.bfloat16).data_ptr()))
    th.start()
    th.join()
    assert other["ptr"] != mine.data_ptr()


def test_fused_bf16_head_is_bit_identical_with_the_reused_buffer(monkeypatch):
    """Forward and backward twice through the reused buffer equal the fresh-cast path exactly."""
    torch.manual_seed(0)
    V, H, N = 300, 16, 10
    w0, h0, lab = torch.randn(V, H), torch.randn(N, H), torch.randint(0, V, (N,))

    def run():
        w, h = w0.clone().requires_grad_(), h0.clone().requires_grad_()
        lp, ent = fused_logprobs_from_hidden(h, w, lab, chunk_size=4, return_entropy=True, matmul_dtype=torch.bfloat16)
        (lp.sum() + 0.1 * ent.sum()).backward()
        return lp.detach(), ent.detach(), h.grad, w.grad

    monkeypatch.setattr(cast_scratch, "MIN_NUMEL", 1 << 40)
    fresh = run()
    monkeypatch.setattr(cast_scratch, "MIN_NUMEL", 16)
    for _ in range(2):  # the second run reads a buffer the first one filled
        reused = run()
        for a, b in zip(fresh, reused):
            assert torch.equal(a, b)
    # the buffer was given back by both the forward and the backward
    assert all(not lent for _, lent in cast_scratch._pool().values())
