"""Log-probs (and entropies) straight from the last hidden states and the LM head.

logits = hidden @ weight.T is (N, V); for long responses and large vocabularies it is the
biggest tensor of the whole step. This autograd Function never builds it: forward computes
``chunk_size`` tokens' logits at a time and keeps only (N,) statistics; backward recomputes
each chunk's logits, turns them into d loss / d logits in place (see ``logprobs``) and
immediately contracts them into the gradients of hidden (N, H) and weight (V, H).
Extra memory: a couple of (chunk_size, V) buffers, plus, when weight is half precision, fp32
copies of weight and of its gradient during backward. ``matmul_dtype=torch.bfloat16`` with an
fp32 head (the update under bf16 autocast, large vocabularies only: see ``bf16_head``) runs the
head's four matmuls in bf16 from a bf16 copy of weight made once per pass (V x H x 2 bytes);
log-softmax and entropy in fp32, the head's gradient summed over chunks in bf16 (one rounding per
chunk) and returned in weight's dtype; an fp32 head whose gradient already exists or was kept
from the last step (kept_grads.py) gets it added into that tensor in place instead, and autograd
gets None for it. top_k / top_p filter each chunk's logits
as ``logprobs.sampling_filter_`` does (the distribution the rollout sampled from).
"""

from __future__ import annotations

import torch

from . import cast_scratch, kept_grads
from .logit_cap import cap_logits_, cap_slope
from .logprobs import _acc_dtype, _chunk_forward, _chunk_grad_, sampling_filter_


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float, acc, scale: float = 1.0,
                  softcap: float = 0.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """cap(scale, softcap)((n, H) @ (V, H).T) / T -> (n, V) in the compute dtype (a fresh, writable
    buffer, or the first n rows of `out` (>= n, V) when given); the model's own logit transform
    (algos/logit_cap.py) comes before the temperature."""
    if out is None:
        z = (h @ weight.T).to(acc)
    elif h.dtype == acc:
        z = torch.mm(h, weight.T, out=out[:h.shape[0]])
    else:
        z = out[:h.shape[0]].copy_(h @ weight.T)
    z = cap_logits_(z, scale, softcap)
    return z.div_(temperature) if temperature != 1.0 else z


LARGE_VOCAB = 1 << 16
"""Vocabularies from which the chunks reuse two preallocated (chunk, V) buffers (`_ChunkBuffers`)
and the forward's statistics come from `_chunk_forward_reusing`. A (147, 151,936) fp32 chunk is
89 MB, above glibc's mmap threshold (32 MB at most): each fresh one was mapped and page-faulted
anew, which in a 6-layer Qwen2.5-0.5B-shaped profile made an elementwise pass over it cost ~1/4 of
the chunk's matmul. Smaller vocabularies keep the former code path bit for bit."""


class _ChunkBuffers:
    """Two (chunk, V) buffers in the compute dtype, reused by every chunk of one pass (None below
    LARGE_VOCAB: fresh tensors per chunk, as before)."""

    def __init__(self, rows: int, vocab: int, dtype, device):
        big = vocab >= LARGE_VOCAB
        self.z = torch.empty(rows, vocab, dtype=dtype, device=device) if big else None
        self.scratch = torch.empty_like(self.z) if big else None


def _chunk_forward_reusing(z: torch.Tensor, scratch: torch.Tensor, labels: torch.Tensor, with_entropy: bool):
    """_chunk_forward without (n, V) temporaries: scratch (>= n, V) is overwritten. lse as
    torch.logsumexp computes it (max, exp of the difference, sum, log); the entropy from the same
    unnormalised exp(z - max) (one exp pass instead of logsumexp's plus the entropy's):
    H = lse - sum(e z) / sum(e)."""
    n = z.shape[0]
    m = z.amax(-1, keepdim=True)  # (n, 1)
    e = torch.sub(z, m, out=scratch[:n]).exp_()
    total = e.sum(-1)
    lse = total.log().add_(m[:, 0])
    logp = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    ent = lse - e.mul_(z).sum(-1).div_(total) if with_entropy else None
    return lse, logp, ent


class _FusedLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_size, with_entropy, top_k=0, top_p=1.0,
                scale=1.0, softcap=0.0, matmul_dtype=None):
        acc = _acc_dtype(hidden.dtype)
        hm, wm = _matmul_operands(hidden, weight, matmul_dtype)
        N = hidden.shape[0]
        lse = torch.empty(N, dtype=acc, device=hidden.device)
        logp = torch.empty_like(lse)
        ent = torch.empty_like(lse) if with_entropy else None
        bufs = _ChunkBuffers(min(chunk_size, N), weight.shape[0], acc, hidden.device)
        for s in range(0, N, chunk_size):
            sl = slice(s, min(s + chunk_size, N))
            z = _chunk_logits(hm[sl], wm, temperature, acc, scale, softcap, bufs.z)  # (n, V)
            sampling_filter_(z, top_k, top_p, labels[sl])
            if bufs.z is None:
                lse[sl], logp[sl], e = _chunk_forward(z, labels[sl], with_entropy)
            else:
                lse[sl], logp[sl], e = _chunk_forward_reusing(z, bufs.scratch, labels[sl], with_entropy)
            if with_entropy:
                ent[sl] = e
            del z
        ctx.save_for_backward(hidden, weight, labels, lse, ent)
        ctx.temperature, ctx.chunk_size, ctx.top_k, ctx.top_p = temperature, chunk_size, top_k, top_p
        ctx.scale, ctx.softcap, ctx.matmul_dtype = scale, softcap, matmul_dtype
        # an output the loss does not use (the entropy of an update without an entropy bonus, kept
        # for its metric) gets None in the backward, not zeros: its terms are skipped
        ctx.set_materialize_grads(False)
        if matmul_dtype is not None:
            cast_scratch.give_back(wm)
        del hm, wm, bufs  # the backward recasts (into the same reused buffer): cheaper than holding it between the passes
        return (logp, ent) if with_entropy else logp

    @staticmethod
    def backward(ctx, g_logp, g_ent=None):
        hidden, weight, labels, lse, ent = ctx.saved_tensors
        T, chunk = ctx.temperature, ctx.chunk_size
        acc = _acc_dtype(hidden.dtype)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        md = ctx.matmul_dtype
        # under `md` the head's gradient accumulates over chunks in `md` inside addmm_ (fp32 sums within
        # each chunk, one rounding per chunk): an fp32 accumulator cost a cast and an add of the
        # (V, H) product per chunk, more than the matmul itself at V = 152k
        grad_w = None  # the first chunk's product, then each later one added (no zero-filled V x H start)
        # an fp32 head's gradient added straight into its .grad (kept_grads: resident memory, no fresh
        # V x H tensor a step); None: returned to autograd as before
        into = kept_grads.grad_buffer(weight) if need_w and weight.dtype == torch.float32 else None
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.to(acc)  # only the entropy was used
        g_ent = None if g_ent is None else g_ent.to(acc)
        hm, wm = _matmul_operands(hidden, weight, md)
        # the gradients' matmuls: in `md` when given, else in fp32 (a bf16 head copied up once, not per chunk)
        w_acc = (wm if md is not None else weight.to(acc)) if need_h else None
        bufs = _ChunkBuffers(min(chunk, hidden.shape[0]), weight.shape[0], acc, hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            sl = slice(s, min(s + chunk, hidden.shape[0]))
            h = hm[sl]
            z = _chunk_logits(h, wm, T, acc, ctx.scale, ctx.softcap, bufs.z)  # recompute (n, V)
            # the transform's slope, read before the filter and the gradient overwrite z
            slope = cap_slope(z, T, ctx.scale, ctx.softcap) if ctx.softcap > 0 or ctx.scale != 1.0 else None
            removed = sampling_filter_(z, ctx.top_k, ctx.top_p, labels[sl])
            e = None if ent is None else ent[sl]
            ge = None if g_ent is None else g_ent[sl]
            dz = _chunk_grad_(z, lse[sl], e, labels[sl], g_logp[sl], ge, T, bufs.scratch)  # d/dlogits (n, V)
            if removed is not None:  # filtered logits get no gradient
                dz.masked_fill_(removed, 0.0)
            if slope is not None:  # through the logit transform, to hidden @ weight.T
                dz.mul_(slope)
            if md is not None:  # the gradient of the logits rounded to `md` for its two matmuls
                dz = dz.to(md)
            if need_h:
                grad_h[sl] = (dz @ w_acc).to(hidden.dtype)
            if need_w:
                hh = h if md is not None else h.to(acc)
                # 0 + x is x: the first product is what addmm_ onto zeros gave, bit for bit
                if into is not None and md is None:  # fp32 products: onto the gradient itself
                    into.addmm_(dz.T, hh)
                else:
                    grad_w = torch.mm(dz.T, hh) if grad_w is None else grad_w.addmm_(dz.T, hh)
            del z, dz
        if md is not None:
            cast_scratch.give_back(wm)
        if into is not None:
            if grad_w is not None:  # the `md` sum, added up into the fp32 gradient (0 + x is x on a fresh one)
                into.add_(grad_w)
            grad_w = None  # already in weight.grad: autograd gets nothing to add
        elif need_w:  # no rows (a sequence-parallel rank whose slice predicts no label): a zero gradient
            grad_w = grad_w.to(weight.dtype) if grad_w is not None else torch.zeros_like(weight)
        return grad_h, grad_w, None, None, None, None, None, None, None, None, None


def _matmul_operands(hidden, weight, matmul_dtype):
    """(hidden, weight) as the head's matmuls read them: unchanged, or cast to `matmul_dtype` (a
    large head into cast_scratch's reused buffer: the caller gives it back after its last read)."""
    if matmul_dtype is None:
        return hidden, weight
    return hidden.to(matmul_dtype), cast_scratch.cast(weight, matmul_dtype)


BF16_HEAD_MIN_VOCAB = 1 << 16  # the vocabulary from which the head joins bf16 autocast (lean.LARGE_VOCAB)


def bf16_head(vocab: int, weight_dtype: torch.dtype, device_type: str) -> bool:
    """Whether the fused head runs its matmuls in bf16: under bf16 autocast, with an fp32 head of
    >= BF16_HEAD_MIN_VOCAB ids. At V = 151,936 the fp32 head's four (tokens, H) x (H, V) passes were
    58% of a 6-layer Qwen2.5-0.5B-shaped update (docs/performance.md); smaller vocabularies keep
    the fp32 head, so the tiny models' numerics under autocast do not change."""
    return (vocab >= BF16_HEAD_MIN_VOCAB and weight_dtype == torch.float32
            and torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16)


FUSED_CHUNK_ELEMENTS = 1 << 22  # logits per chunk: 16 MiB in fp32 (131 tokens at V = 32000)
FUSED_CHUNK_BUDGET = 256 << 20  # bytes of the (chunk, V) fp32 buffers a chunk keeps alive at once (~3)
MIN_EFFICIENT_ROWS = 128  # below this many rows the (rows, H) @ (H, V) matmul is bound by reading the head


def auto_chunk_rows(vocab: int, budget_bytes: int = FUSED_CHUNK_BUDGET) -> int:
    """Tokens per fused chunk for a vocabulary of `vocab` ids: as many as ~3 fp32 (rows, V) buffers
    fit in `budget_bytes`, and never fewer than FUSED_CHUNK_ELEMENTS // V. Every chunk reads the
    whole (V, H) head three times (forward, recomputed logits, grad of hidden) and adds into the
    (V, H) head gradient once, so at V = 152k the former 27-row chunks spent their time streaming
    the 0.5 GB head through memory; 256 MiB gives 147 rows there (a matmul of near-peak shape)
    and changes nothing for small vocabularies, whose chunks already held all tokens (V = 99:
    42k rows)."""
    return max(1, FUSED_CHUNK_ELEMENTS // vocab, budget_bytes // (3 * 4 * vocab))



def fused_logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    return_entropy: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    logit_scale: float = 1.0,
    logit_softcap: float = 0.0,
    matmul_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``labels`` under softmax(cap(hidden @ weight.T) / T), chunked over tokens.

    hidden (N, H), weight (V, H) (the LM head, no bias), labels (N,) int64 in [0, V).
    -> (logp (N,), entropy (N,) or None). Gradients flow to hidden and weight, through the
    entropy too when it is returned. Output dtype: fp32 for half/bf16 inputs.
    ``chunk_size`` tokens per chunk; None (or <= 0): ``auto_chunk_rows`` (the vocabulary and a
    256 MiB budget for the transient (chunk, V) buffers).
    ``top_k`` / ``top_p``: the rollout's sampling filter (``logprobs.sampling_filter_``).
    ``logit_scale`` / ``logit_softcap``: the model's own transform of its head's output
    (``logit_cap.cap_logits``; models/checks.logit_transform reads it from the config); 1 / 0: none.
    ``matmul_dtype``: None (the inputs' dtype) or torch.bfloat16: the head's matmuls in bf16, the
    logits rounded to bf16 before the fp32 log-softmax (~2^-8 |logit| each), the gradients
    to bf16 before their matmuls; grad of weight summed over chunks in bf16, returned in weight's dtype.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError("expected hidden (N, H), weight (V, H), labels (N,)")
    if chunk_size is None or chunk_size <= 0:
        chunk_size = auto_chunk_rows(weight.shape[0])
    if return_entropy:
        logp, ent = _FusedLogProb.apply(hidden, weight, labels, float(temperature), chunk_size, True,
                                        int(top_k), float(top_p), float(logit_scale), float(logit_softcap), matmul_dtype)
        return logp, ent
    return _FusedLogProb.apply(hidden, weight, labels, float(temperature), chunk_size, False,
                               int(top_k), float(top_p), float(logit_scale), float(logit_softcap), matmul_dtype), None
