"""Vectorised reverse linear recurrence, the engine behind GAE and discounted returns.

Solves, for every row independently,

    A[t] = b[t] + a[t] * A[t + 1],    A[T] = 0,

without a Python loop over time: a Hillis-Steele doubling scan inside chunks of ``chunk``
steps (log2(chunk) passes over the data), then the same scan, recursively, over the chunk
boundaries. Only products and sums appear, so it is exact in the algebraic sense for any
a (including 0) and as accurate as the sequential loop in floating point.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _doubling_scan(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b: (R, C) -> (A (R, C), P (R, C)) with P[t] = prod_{k >= t} a[k] (within the row)."""
    a, b = a.clone(), b.clone()
    C = b.shape[-1]
    d = 1
    while d < C:
        # Window [t, t + 2d) = window [t, t + d) composed with window [t + d, t + 2d).
        b[:, :-d] += a[:, :-d] * b[:, d:]  # right side is evaluated into a temporary first
        a[:, :-d] = a[:, :-d] * a[:, d:]
        d *= 2
    return b, a


def reverse_linear_scan(a: torch.Tensor, b: torch.Tensor, chunk: int = 32) -> torch.Tensor:
    """A[t] = b[t] + a[t] * A[t+1] along the last dim. a, b: (R, T) -> (R, T)."""
    R, T = b.shape
    if T <= chunk:
        return _doubling_scan(a, b)[0]
    n_chunks = -(-T // chunk)
    pad = n_chunks * chunk - T
    if pad:
        a = F.pad(a, (0, pad), value=1.0)
        b = F.pad(b, (0, pad), value=0.0)
    A, P = _doubling_scan(a.reshape(R * n_chunks, chunk), b.reshape(R * n_chunks, chunk))
    A = A.view(R, n_chunks, chunk)
    P = P.view(R, n_chunks, chunk)
    # Full value at each chunk start: X[k] = A[k, 0] + P[k, 0] * X[k + 1]  (R, n_chunks)
    X = reverse_linear_scan(P[:, :, 0].contiguous(), A[:, :, 0].contiguous(), chunk)
    X_next = torch.cat([X[:, 1:], X.new_zeros(R, 1)], dim=1)  # (R, n_chunks)
    out = A.addcmul_(P, X_next.unsqueeze(-1))  # A is our own buffer
    return out.reshape(R, n_chunks * chunk)[:, :T]


def discounted_reverse_cumsum(b: torch.Tensor, c: torch.Tensor, chunk: int = 32) -> torch.Tensor:
    """A[t] = b[t] + c * A[t+1] with one coefficient per row. b: (R, T), c: (R,) -> (R, T).

    The constant-coefficient case of `reverse_linear_scan`, about twice as fast: the window
    products are the scalars c^d, so each doubling pass is a single fused multiply-add.
    """
    R, T = b.shape
    n = -(-T // chunk)
    x = F.pad(b, (0, n * chunk - T)).reshape(R, n, chunk)  # a fresh buffer we may write into
    cd = c.to(b.dtype).reshape(R, 1, 1)
    d = 1
    while d < chunk:
        x[..., :-d] += cd * x[..., d:]  # the product is evaluated into a temporary first
        cd = cd * cd
        d *= 2
    if n > 1:
        # Value at each chunk start, then each position adds c^(chunk - i) times the next chunk's.
        starts = discounted_reverse_cumsum(x[:, :, 0].contiguous(), (cd.reshape(R) if chunk & (chunk - 1) == 0
                                                                      else c.to(b.dtype) ** chunk), chunk)
        nxt = F.pad(starts[:, 1:], (0, 1))  # (R, n)
        powers = c.to(b.dtype).reshape(R, 1) ** torch.arange(chunk, 0, -1, dtype=b.dtype, device=b.device)  # (R, chunk)
        x += powers.unsqueeze(1) * nxt.unsqueeze(-1)
    return x.reshape(R, n * chunk)[:, :T]
