"""Vectorised reverse linear recurrence, the engine behind GAE and discounted returns.

Solves, for every row independently,

    A[t] = b[t] + a[t] * A[t + 1],    A[T] = 0,

for a coefficient a that is one constant per row (GAE and discounted returns), without a
Python loop over time: inside each chunk of ``chunk`` steps the recursion is a fixed
upper-triangular Toeplitz matrix of powers of a, so one batched matmul solves every chunk;
the chunk boundaries form the same recursion with coefficient a^chunk, solved the same way
one level up. Only products and sums appear, so it is exact in the algebraic sense for any
coefficient (including 0) and as accurate as the sequential loop in floating point.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


def discounted_reverse_cumsum(b: torch.Tensor, c: torch.Tensor, chunk: int = 32) -> torch.Tensor:
    """A[t] = b[t] + c * A[t+1] with one coefficient per row. b: (R, T), c: (R,) -> (R, T).

    The readable entry point (the GAE hot path calls `discount_levels` once and
    `discounted_reverse_cumsum_with` per row block itself).
    """
    R, T = b.shape
    W = max(1, -(-T // chunk)) * chunk
    levels = discount_levels(c.to(b.dtype), W, chunk)
    return discounted_reverse_cumsum_with(F.pad(b, (0, W - T)), levels)[:, :T]


def discount_levels(c: torch.Tensor, width: int, chunk: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The per-row operators of a discounted reverse cumsum over ``width`` steps. c: (R,).

    Level l works on chunk boundaries l times removed, with coefficient c_l = c^(chunk^l),
    and holds (MT (R, C, C) with MT[j, i] = c_l^(j - i) for j >= i, else 0;
    powers (R, C) with powers[i] = c_l^(C - i)). Computed once per call and sliced per row
    block, so the scan itself is a handful of tensor ops per level.
    """
    if chunk < 2:
        raise ValueError(f"chunk must be >= 2, got {chunk}")
    e = torch.arange(chunk, dtype=c.dtype, device=c.device)
    levels, cl, n = [], c.reshape(-1, 1), -(-width // chunk)
    while True:
        pw = cl**e  # (R, C): c_l^0 .. c_l^(C-1)
        # Toeplitz MT[j, i] = pw[j - i] (0 above the diagonal) from sliding windows over
        # [0] * (C - 1) + pw: cheaper than raising a (R, C, C) tensor of exponents.
        MT = F.pad(pw, (chunk - 1, 0)).unfold(-1, chunk, 1).flip(-1)
        levels.append((MT, cl ** (chunk - e)))  # powers[i] = c_l^(C - i)
        if n <= 1:
            return levels
        n = -(-n // chunk)
        cl = cl**chunk


def discounted_reverse_cumsum_with(
    x: torch.Tensor,
    levels: list[tuple[torch.Tensor, torch.Tensor]],
    rows: slice = slice(None),
    out: torch.Tensor | None = None,
    level: int = 0,
) -> torch.Tensor:
    """A[t] = x[t] + c * A[t+1], A[W] = 0, along rows of x (n, W), W a multiple of the chunk
    (pad with zeros); the operators come from `discount_levels` (its rows ``rows``). Writes A
    into ``out`` (n, W) when given (it must not overlap x), else a new tensor; x is unchanged.
    """
    if level == 0 and torch.get_float32_matmul_precision() != "highest":
        with _ieee_fp32_matmul():
            return discounted_reverse_cumsum_with(x, levels, rows, out, level)
    MT, powers = levels[level]
    MT, powers = MT[rows], powers[rows]
    n, W = x.shape
    C = MT.shape[-1]
    k = W // C
    A = torch.bmm(x.view(n, k, C), MT, out=None if out is None else out.view(n, k, C))  # (n, k, C)
    if k > 1:
        # Full value at each chunk start, one level up: X[k] = A[k, 0] + c^C X[k + 1].
        starts = x.new_zeros(n, -(-k // C) * C)
        starts[:, :k] = A[:, :, 0]
        X = discounted_reverse_cumsum_with(starts, levels, rows, level=level + 1)
        # Position i of chunk k then adds c^(C - i) times the full value at chunk k + 1.
        A[:, :-1].addcmul_(powers.unsqueeze(1), X[:, 1:k].unsqueeze(-1))
    return A.view(n, W)


@contextlib.contextmanager
def _ieee_fp32_matmul():
    """Full-precision fp32 matmuls for the duration. The chunk solves are matmuls, and the
    faster modes that `torch.set_float32_matmul_precision("high" / "medium")` turns on (TF32 or
    bf16 inputs, common on GPUs) round to 10 or 8 mantissa bits: advantages off by ~1e-3."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)
