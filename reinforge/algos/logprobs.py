"""Token log-probs and entropies from logits, without a second (N, V) float tensor.

log p(y) = z_y - logsumexp(z) and H = logsumexp(z) - sum_v p_v z_v with z = logits / T.
The naive ``log_softmax(logits).gather(labels)`` keeps a full (N, V) log-softmax alive for
backward (100% extra memory over the logits), and a naive entropy adds another. Here a
custom autograd Function walks the rows in chunks: forward keeps only (N,) statistics
(logsumexp and entropy), backward recomputes each chunk's softmax directly inside the
(N, V) gradient buffer it has to return anyway. Peak extra memory is a few chunks.

Gradients, per row, with p = softmax(z), log p = z - lse, g = upstream grads:
  d logp_y / dz = onehot(y) - p
  d H / dz      = -p * (log p + H)
so dz = g_logp * onehot(y) - p * (g_logp + g_H * (log p + H)), and d/dlogits = dz / T.
Labels must be valid indices in [0, V) (mask padding positions, do not use -100).

Top-k / top-p (`sampling_filter_`): when the rollout sampled from a filtered distribution,
z is filtered the same way before the softmax, so log-probs, entropies and gradients are those
of the renormalised distribution over the kept tokens (the label is always kept, see there).
top_k=0 and top_p=1 skip the filter: the full softmax, unchanged numerics.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 20  # elements of a (rows, V) float chunk: 4 MiB in fp32, cache-friendly


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Compute in fp32 at least (bf16/fp16 logits), fp64 stays fp64."""
    return torch.promote_types(dtype, torch.float32)


def _row_blocks(x: torch.Tensor) -> list[torch.Tensor]:
    """2-D views (rows, V) covering x's rows in order, without copying.

    A contiguous x gives one block; a sliced (B, T, V) view (e.g. logits[:, P-1:-1]) gives one
    block per sequence.
    """
    try:
        return [x.view(-1, x.shape[-1])]
    except RuntimeError:
        if x.dim() <= 2:
            return [x.contiguous()]  # a strided 2-D matrix: nothing better to do
        return [blk for sub in x.unbind(0) for blk in _row_blocks(sub)]


def filter_active(V: int, top_k: int, top_p: float) -> bool:
    """Whether top-k / top-p remove anything from a V-way distribution."""
    return 0 < top_k < V or top_p < 1.0


def sampling_filter_(z: torch.Tensor, top_k: int = 0, top_p: float = 1.0,
                     keep: torch.Tensor | None = None) -> torch.Tensor | None:
    """Top-k, then top-p over what remains (transformers' warper order and tie rules), in place.

    z (n, V) temperature-scaled logits in the compute dtype; removed entries are set to the
    dtype's lowest value, so softmax gives them exactly 0 without inf arithmetic. keep (n,):
    token ids never removed (the labels: a token sampled by the rollout policy is always inside
    its kept set; under another policy, the updated actor or the reference, it may fall outside,
    and keeping it gives a small finite log-prob instead of -inf).
    Returns the removed mask (n, V) bool, or None when the filter is inactive (z untouched).
    """
    V = z.shape[-1]
    if not filter_active(V, top_k, top_p):
        return None
    removed = torch.zeros(z.shape, dtype=torch.bool, device=z.device)
    if 0 < top_k < V:
        removed = z < z.topk(top_k, dim=-1).values[..., -1:]
    if top_p < 1.0:
        s, idx = z.masked_fill(removed, float("-inf")).sort(dim=-1)  # ascending, like the warper
        drop = s.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1] = False  # the most likely token always stays
        removed |= drop.scatter(-1, idx, drop)
    if keep is not None:
        removed.scatter_(-1, keep.reshape(-1, 1), False)
    z.masked_fill_(removed, torch.finfo(z.dtype).min)
    return removed


def sampling_log_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """log softmax(filter(logits / temperature)) (n, V) in fp32: the distribution a rollout samples
    from, over the whole vocabulary (filtered entries get a very negative log-prob)."""
    z = logits.float() / temperature
    sampling_filter_(z, top_k, top_p)
    return z.log_softmax(-1)


def _chunk_forward(z: torch.Tensor, labels: torch.Tensor, with_entropy: bool):
    """z (n, V) temperature-scaled logits in the compute dtype -> lse, logp, entropy (n,) each."""
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    ent = None
    if with_entropy:
        p = (z - lse.unsqueeze(-1)).exp_()  # one chunk-sized temporary
        ent = lse - p.mul_(z).sum(-1)
    return lse, logp, ent


def _chunk_grad_(buf, lse, ent, labels, g_logp, g_ent, temperature: float, scratch=None) -> torch.Tensor:
    """Turn buf (n, V), holding z = logits / T, into d loss / d logits, in place.

    lse, labels, g_logp: (n,); ent, g_ent: (n,) or None. Needs one chunk-sized temporary (the
    first n rows of `scratch` (>= n, V) when given).
    """
    buf.sub_(lse.unsqueeze(-1))  # log p
    if ent is not None and g_ent is not None:
        p = buf.exp() if scratch is None else torch.exp(buf, out=scratch[:buf.shape[0]])
        buf.add_(ent.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1)).add_(g_logp.unsqueeze(-1))
        buf.mul_(p).neg_()
    else:
        buf.exp_().mul_(-g_logp.unsqueeze(-1))
    buf.scatter_add_(-1, labels.unsqueeze(-1), g_logp.unsqueeze(-1).to(buf.dtype))
    if temperature != 1.0:
        buf.div_(temperature)
    return buf


class _LogProbEntropy(torch.autograd.Function):
    """(..., V) logits, (...) labels -> logp (N,) [, entropy (N,)] in row chunks."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, with_entropy, chunk_rows, top_k=0, top_p=1.0):
        acc = _acc_dtype(logits.dtype)
        filt = filter_active(logits.shape[-1], top_k, top_p)
        labels = labels.reshape(-1)
        N = labels.numel()
        lse = torch.empty(N, dtype=acc, device=logits.device)
        logp = torch.empty_like(lse)
        ent = torch.empty_like(lse) if with_entropy else None
        start = 0
        for block in _row_blocks(logits):
            for s in range(0, block.shape[0], chunk_rows):
                z = block[s : s + chunk_rows].to(acc, copy=filt)  # the filter writes into z
                if temperature != 1.0:
                    z = z / temperature
                sl = slice(start + s, start + s + z.shape[0])
                if filt:
                    sampling_filter_(z, top_k, top_p, labels[sl])
                lse[sl], logp[sl], e = _chunk_forward(z, labels[sl], with_entropy)
                if with_entropy:
                    ent[sl] = e
            start += block.shape[0]
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.temperature, ctx.chunk_rows, ctx.top_k, ctx.top_p = temperature, chunk_rows, top_k, top_p
        return (logp, ent) if with_entropy else logp

    @staticmethod
    def backward(ctx, g_logp, g_ent=None):
        logits, labels, lse, ent = ctx.saved_tensors
        T, rows = ctx.temperature, ctx.chunk_rows
        acc = _acc_dtype(logits.dtype)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        g_logp = g_logp.to(acc)
        g_ent = None if g_ent is None else g_ent.to(acc)
        gflat = grad.view(-1, grad.shape[-1])
        start = 0
        for block in _row_blocks(logits):
            for s in range(0, block.shape[0], rows):
                src = block[s : s + rows]
                sl = slice(start + s, start + s + src.shape[0])
                dst = gflat[sl]
                if src.dtype == acc and T == 1.0:
                    buf = dst.copy_(src)  # work directly in the gradient buffer
                else:
                    buf = src.to(acc) / T if T != 1.0 else src.to(acc)
                e = None if ent is None else ent[sl]
                ge = None if g_ent is None else g_ent[sl]
                removed = sampling_filter_(buf, ctx.top_k, ctx.top_p, labels[sl])
                buf = _chunk_grad_(buf, lse[sl], e, labels[sl], g_logp[sl], ge, T)
                if removed is not None:  # filtered logits get no gradient (and no 0 * lowest)
                    buf.masked_fill_(removed, 0.0)
                if buf.data_ptr() != dst.data_ptr():
                    dst.copy_(buf)
            start += block.shape[0]
        return grad, None, None, None, None, None, None


def _rows_for(V: int, chunk_size: int | None) -> int:
    return max(1, CHUNK_ELEMENTS // V) if chunk_size is None else max(1, int(chunk_size))


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None,
    top_k: int = 0, top_p: float = 1.0,
) -> torch.Tensor:
    """log softmax(filter(logits / T))[labels]. logits (..., V), labels (...) int64 -> (...).

    Output dtype: fp32 for half/bf16 logits, else the logits' dtype. chunk_size: rows per
    chunk (None -> about 1M elements per chunk). top_k / top_p: `sampling_filter_`.
    """
    rows = _rows_for(logits.shape[-1], chunk_size)
    logp = _LogProbEntropy.apply(logits, labels, float(temperature), False, rows, int(top_k), float(top_p))
    return logp.view(labels.shape)


def logprobs_and_entropy_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None,
    top_k: int = 0, top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both log-probs and entropies in one pass. (..., V), (...) -> ((...), (...)).

    Use this rather than two separate calls when both need gradients: one backward writes one
    (N, V) gradient buffer instead of two that autograd would then add. The entropy is that of
    the filtered distribution when top_k / top_p are set (the one the rollout sampled from).
    """
    rows = _rows_for(logits.shape[-1], chunk_size)
    logp, ent = _LogProbEntropy.apply(logits, labels, float(temperature), True, rows, int(top_k), float(top_p))
    return logp.view(labels.shape), ent.view(labels.shape)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / T), plain autograd. (..., V) -> (...).

    Materialises softmax; fine for small inputs, see ``entropy_from_logits_chunked``.
    """
    z = logits.to(_acc_dtype(logits.dtype)) / temperature
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)


def entropy_from_logits_chunked(
    logits: torch.Tensor, chunk_size: int = 2048, temperature: float = 1.0
) -> torch.Tensor:
    """Entropy of softmax(logits / T), chunk_size rows at a time, memory-light backward.

    (..., V) -> (...).
    """
    labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    _, ent = logprobs_and_entropy_from_logits(logits, labels, temperature, chunk_size)
    return ent
