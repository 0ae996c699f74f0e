"""A real vocabulary's head / embedding gradient kept between optimizer steps, not freed and remade.

After each optimizer step the gradients are dropped (`zero_grad(set_to_none=True)`), and the next
backward makes them anew. For the layers that is memory the allocator hands back warm; a (V, H)
fp32 gradient of a real vocabulary (545 MB at 151,936 x 896) is above glibc's mmap threshold, so
each step's new one is mapped afresh and first-touched page by page, and in bf16 autocast the
fused head's gradient was also cast up into another fresh one (docs/performance.md, "Reused cast
buffers": 339 ms for that cast).

`release(params)` is the optimizer's zero_grad: every gradient is set to None, as before, but
one of at least `cast_scratch.MIN_NUMEL` elements is kept aside for its parameter. `grad_buffer(p)`
is for backward code that adds into a parameter's gradient itself (the fused log-prob head, the
tied embedding lookup): it returns `p.grad` when there is one, else the kept tensor, zeroed and
installed as `p.grad`, else None (the caller makes a fresh one, as on the first step). A
parameter that gets no gradient in a step keeps `grad` None, so the optimizer skips it exactly
as before (no weight decay on a zero gradient). The kept memory stays resident between the
steps (the generation runs with it), which the step's peak at the end of the backward already
included.

Only a plain tensor on its own process qualifies: a sharded parameter (FSDP2's DTensor, or its
unsharded copy, whose gradient FSDP frees after reducing it) never has a kept tensor or a live
`.grad` at the time of its backward, so it always takes the autograd path.
"""
from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from reinforge.algos.cast_scratch import MIN_NUMEL

_kept = WeakIdKeyDictionary()
"""parameter -> its kept gradient tensor. Beside the parameter, not on it, so a deepcopy of the
model (the asynchronous producer's behaviour copy) never copies a kept gradient."""


def _keepable(p: torch.Tensor, g: torch.Tensor) -> bool:
    return (g.numel() >= MIN_NUMEL and type(g) is torch.Tensor and g.layout == torch.strided
            and g.shape == p.shape and g.dtype == p.dtype and g.is_contiguous())


def release(params) -> None:
    """zero_grad(set_to_none=True) over `params`, keeping the large gradients' memory aside."""
    for p in params:
        g = p.grad
        if g is None:
            continue
        if _keepable(p, g):
            _kept[p] = g
        p.grad = None


def release_optimizer(opt: torch.optim.Optimizer) -> None:
    """`release` over every parameter of `opt`'s groups."""
    release(p for group in opt.param_groups for p in group["params"])


def grad_buffer(p: torch.Tensor) -> torch.Tensor | None:
    """The tensor to add `p`'s gradient into in place: p.grad if set; else the kept one, zeroed and
    made p.grad; else None (no gradient yet and none kept: the caller returns a fresh one)."""
    if p.grad is not None:  # autograd keeps a gradient in its parameter's dtype and shape
        return p.grad
    kept = _kept.pop(p, None)
    if kept is None:
        return None
    p.grad = kept.zero_()
    return kept
