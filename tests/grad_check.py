"""Compare two ways of computing an update by their gradients, not by the weights after AdamW.

AdamW divides by sqrt(v): on a gradient entry near zero (|g| ~ eps = 1e-8) a last-bit
difference, from another summation order (CPU, thread count, micro-batching, ranks), moves
that weight by up to ~lr. Weights after an optimizer step therefore differ by amounts that
depend on the machine, while the gradients that went into the step agree to float32
rounding. So a test records the accumulated gradient at every `opt.step` of both runs and
compares them relative to the gradient's scale. Where the runs take several steps, the
second run steps with the first run's recorded gradient ("replay"): both stay at the same
weights, so their later gradients and losses are comparable as tightly as the first.
"""
from __future__ import annotations

import functools

import torch

# float32 rounding of a gradient summed in another order is ~1e-7 of its scale; 1e-5 leaves
# room for any CPU or thread count and still fails a gradient off by a factor or a term.
GRAD_RTOL = 1e-5


def _full(t: torch.Tensor) -> torch.Tensor:
    """A gradient as a plain tensor (under FSDP2 a sharded DTensor: gathered, a collective)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def record_steps(opt, params, replay: list | None = None) -> list[list[torch.Tensor]]:
    """Wrap `opt.step` so that every step first appends a copy of `params`' gradients to the
    returned list; with `replay` (plain tensors), step i then overwrites them with replay[i],
    the other run's step i, before stepping. The optimizer gets the gradients after clipping,
    which would scale a gradient off by a factor back to the same norm: a test of the
    gradient's scale sets grad_clip=0. FSDP2 ranks all run this at each step, so the gathers meet."""
    seen: list[list[torch.Tensor]] = []
    step = opt.step

    @functools.wraps(step)  # keeps the LR scheduler's mark on the step it wrapped (else it warns)
    def recording_step(*args, **kwargs):
        seen.append([_full(p.grad).detach().clone() for p in params])
        if replay is not None:
            with torch.no_grad():
                for p, g in zip(params, replay[len(seen) - 1]):
                    p.grad.copy_(g)
        return step(*args, **kwargs)

    opt.step = recording_step
    return seen


def grad_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """max |a - b| over all tensors, relative to max |a| over all tensors: relative to the whole
    gradient, because some entries are rounding noise around zero (e.g. a key bias, whose
    gradient vanishes in exact arithmetic) and have no scale of their own."""
    scale = max(float(g.abs().max()) for g in a)
    assert scale > 0, "the gradient is zero: nothing to compare"
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) / scale


def assert_same_steps(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]], rtol: float = GRAD_RTOL) -> None:
    """Both runs took the same number of steps (at least one) with the same gradients."""
    assert len(a) == len(b) > 0, (len(a), len(b))
    for i, (ga, gb) in enumerate(zip(a, b)):
        gap = grad_gap(ga, gb)
        assert gap <= rtol, f"step {i}: max |g_a - g_b| / max |g_a| = {gap:.2e} > {rtol:.0e}"
