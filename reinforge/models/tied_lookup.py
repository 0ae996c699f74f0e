"""A tied input embedding whose lookup adds its gradient into the shared weight's `.grad` in place.

With tied embeddings (Qwen2.5-0.5B, Qwen3-0.6B, Llama-3.2-1B, the tiny models) one (V, H)
weight is both the lookup table and the LM head. Autograd then gives it two gradients: the
head's, dense, and the lookup's, which `embedding_backward` also builds dense: a zero-filled
(V, H) tensor into which the B x L looked-up rows are added, then summed with the head's. At
V = 151,936 and H = 896 that second tensor is 0.545 GB in fp32, alive at the end of the backward
(where the fp32 update's memory peaks), and its zero fill alone took 741 ms of a 10 s update
(docs/performance.md, "Reused cast buffers").

`TiedEmbedding.forward` looks the rows up from the detached weight through `_TiedLookup`, whose
backward adds the B x L gradient rows straight into `weight.grad` (`index_add_`): the one the
head's backward made, else the tensor algos/kept_grads.py kept from the last step (zeroed), else
a new zero one. The head's gradient reaches `weight.grad` through autograd
as before; the sum is the same either way round (the engine runs the weight's accumulation as
soon as the head's backward is done, so in practice the head's gradient comes first and the
lookup's rows are added into it). Only the summation order of the looked-up rows differs from
`embedding_backward`'s (~1e-7 relative in fp32; tests/test_tied_lookup.py).

Only for tables of at least 2^26 weights (a real vocabulary's: 136M at Qwen2.5-0.5B): below, a
changed summation order is all it would bring, and the demo's numbers depend on the exact
gradient. Used for training models on one process or under a local process group (models/loading.py);
`untie_lookup` restores the plain module before FSDP2 shards the model (distributed/fsdp.py),
whose gradient reduction must see every contribution through autograd. The lookup also falls
back to the plain one whenever no gradient is wanted (no_grad, a frozen embedding under LoRA).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reinforge.algos import kept_grads
from reinforge.algos.cast_scratch import MIN_NUMEL

# MIN_NUMEL (2^26, cast_scratch's): only a real vocabulary's table, where the second (V, H) gradient
# costs; smaller models (the demo's, the tests') keep autograd's lookup gradient and its numerics
# bit for bit (the demo's SFT base moved by 10 points with the summation order changed).


class _TiedLookup(torch.autograd.Function):
    """ids (...,) int64 -> rows (..., H) of `weight`. `anchor` is an empty tensor that requires
    grad: it makes the output require grad without an autograd edge to `weight` (passed inside a
    tuple, so autograd does not see it), whose gradient the backward writes itself."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, anchor: torch.Tensor, holder: tuple) -> torch.Tensor:
        weight, padding_idx = holder
        ctx.holder = holder
        ctx.save_for_backward(ids)
        return F.embedding(ids, weight.detach(), padding_idx)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        weight, padding_idx = ctx.holder
        with torch.no_grad():
            rows = grad.reshape(-1, grad.shape[-1]).to(weight.dtype)  # (B L, H)
            idx = ids.reshape(-1)
            if padding_idx is not None:  # embedding_backward gives the padding row no gradient
                keep = idx != padding_idx
                rows, idx = rows[keep], idx[keep]
            into = kept_grads.grad_buffer(weight)  # the head's gradient, the kept one zeroed, or None
            if into is None:
                weight.grad = into = torch.zeros_like(weight)
            into.index_add_(0, idx, rows)
        return None, None, None


class TiedEmbedding(nn.Embedding):
    """nn.Embedding whose gradient goes into the weight's `.grad` in place (module docstring).
    Same parameters and state dict; `tie_lookup` swaps a module's class to this one."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not (torch.is_grad_enabled() and w.requires_grad):
            return super().forward(ids)
        anchor = torch.empty(0, device=w.device, requires_grad=True)
        return _TiedLookup.apply(ids, anchor, (w, self.padding_idx))


def _plain(emb) -> bool:
    """An nn.Embedding with none of the options whose gradient this lookup does not reproduce."""
    return (type(emb) is nn.Embedding and emb.max_norm is None and not emb.scale_grad_by_freq
            and not emb.sparse)


def tie_lookup(model) -> bool:
    """Swap the input embedding of `model` (an HF model, or a PEFT wrapper of one) to
    TiedEmbedding when it is a plain nn.Embedding of at least MIN_NUMEL weights sharing its weight
    with the output head. Returns whether it did."""
    from reinforge.models.forward import unwrap_peft

    inner = unwrap_peft(model)
    emb = inner.get_input_embeddings() if hasattr(inner, "get_input_embeddings") else None
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if emb is None or head is None or getattr(head, "weight", None) is not emb.weight or not _plain(emb):
        return False
    if emb.weight.numel() < MIN_NUMEL:
        return False
    emb.__class__ = TiedEmbedding
    return True


def untie_lookup(model) -> None:
    """Undo `tie_lookup` on every module of `model` (the plain nn.Embedding again)."""
    for m in model.modules():
        if type(m) is TiedEmbedding:
            m.__class__ = nn.Embedding
