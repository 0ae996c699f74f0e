"""Casts of large weights into buffers kept for the thread, instead of a fresh tensor per cast.

At a real vocabulary the head (151,936 x 896) is cast to bf16 several times a step: by the fused
log-prob head under bf16 autocast (its forward, its backward, the no-grad old-log-prob and
reference passes) and by the bf16 decode copy. A fresh 272 MB tensor is memory the allocator
maps anew (glibc serves anything over 32 MB with mmap and unmaps it on free), and on the CPU
machines we measured, first-touching it cost 96-930 ms against ~20-28 ms for the same cast into a
resident buffer (docs/performance.md, "Reused cast buffers"). So a cast of a tensor of at least
`MIN_NUMEL` elements goes into a buffer this thread keeps for that shape and dtype.

A buffer is lent: `cast(t, dtype)` returns it marked in use and `give_back(buf)` returns it;
a second cast of the same shape while the first is out gets a fresh tensor (two live copies
never share memory), as does a cast after an error that skipped `give_back`. Buffers are per
thread (the asynchronous rollout's producer casts in its own). The price is the buffer's
memory, held for the process's life: 272 MB for the bf16 head of a 0.5B Qwen2.
"""
from __future__ import annotations

import threading

import torch

MIN_NUMEL = 1 << 26
"""Elements from which a cast reuses a buffer (67M: the embedding of a real vocabulary, not a layer)."""

_local = threading.local()


def _pool() -> dict:
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = {}
    return pool


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t.to(dtype)`, for a large `t` into this thread's lent buffer of its shape (see the module
    docstring); the values are the same either way. Pair with `give_back`."""
    if t.dtype == dtype or t.numel() < MIN_NUMEL:
        return t.to(dtype)
    key = (tuple(t.shape), dtype, t.device)
    entry = _pool().get(key)
    if entry is None:
        entry = _pool()[key] = [torch.empty(t.shape, dtype=dtype, device=t.device), False]
    if entry[1]:  # already lent: a fresh copy
        return t.to(dtype)
    entry[1] = True
    return entry[0].copy_(t)


def give_back(buf: torch.Tensor | None) -> None:
    """Returns a buffer `cast` lent (anything else: nothing happens). The caller must not read it after."""
    if buf is None:
        return
    entry = _pool().get((tuple(buf.shape), buf.dtype, buf.device))
    if entry is not None and entry[0].data_ptr() == buf.data_ptr():  # `p.data` is a new alias each read
        entry[1] = False

