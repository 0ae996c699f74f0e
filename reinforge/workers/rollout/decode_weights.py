"""Decoding from a lower-precision copy of the weights (`rollout.dtype=bfloat16`).

A decode step reads every weight once for a handful of rows: on a CPU it is bound by the
weight bytes and by skinny fp32 matmuls, both of which bf16 halves or better. `cast_weights`
swaps each floating parameter's storage for a copy in `dtype` for the duration of a
generation and puts the fp32 storage back afterwards: the model's own modules (LoRA layers,
tied embeddings: one copy per distinct parameter) decode in bf16, nothing outlives the call,
and the training weights are never modified. Buffers (RoPE's inverse frequencies) stay as
they are. The copy costs one cast of the weights per generation (~N x 6 bytes of traffic) and
N x 2 bytes while it lives, at a time when the gradients are freed, so it does not raise the
step's peak; a real vocabulary's embedding is cast into algos/cast_scratch's reused buffer (the
one the fused log-prob head casts into), not a fresh mapping each generation. When the lean loop
packs the linear layers (packed_linears.py), their weights are skipped here and cast one at a
time as they are packed, so the whole-model copy holds only the embedding, norms and biases.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from reinforge.algos import cast_scratch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@contextmanager
def cast_weights(model, dtype: torch.dtype | None, skip: frozenset[int] = frozenset()):
    """Within the block, every floating parameter of `model` of another dtype is a `dtype` copy
    (None: nothing changes), except those whose id() is in `skip` (the linear weights that
    packed_linears casts one at a time as it packs them, so their plain copies never exist all at
    once). Restored on exit, exceptions included."""
    if dtype is None:
        yield model
        return
    saved, seen = [], set(skip)
    for p in model.parameters():
        if id(p) in seen or not p.is_floating_point() or p.dtype == dtype:
            continue
        seen.add(id(p))
        saved.append((p, p.data))
    try:
        for p, data in saved:
            p.data = cast_scratch.cast(data, dtype)  # a large embedding: into the thread's reused buffer
        yield model
    finally:
        for p, data in saved:
            cast_scratch.give_back(p.data)
            p.data = data
