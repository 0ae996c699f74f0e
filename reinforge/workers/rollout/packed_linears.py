"""Decoding with each linear layer's weight reordered once per generation (the lean loop on a CPU).

A bf16 or fp32 `F.linear` on a CPU runs through oneDNN (bf16) or the BLAS (fp32), and oneDNN
reorders the weight into its blocked layout at every call: at the decode shape (16 rows x 896
x 4864, the weight streamed from memory once a token) that reorder is most of the matmul's
time. `packed_linears` reorders every `nn.Linear` weight once, when a generation starts
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor's CPU freezing pass uses), and
routes the layer's forward through `torch.ops.mkldnn._linear_pointwise` until the generation
ends. Measured on a 2-thread Zen 4 CPU (docs/performance.md, "At a real shape"): bf16 177 ->
296 GFLOP/s at 16 x 896 x 4864 streamed, the 151,936-row head 181 -> 261; fp32 55 -> 130.

Numerics: in bf16 the packed product is bit-identical to `F.linear` (the same oneDNN kernel,
without the per-call reorder; tests/test_packed_linears.py). In fp32 it is oneDNN instead of the
BLAS, a different summation order (~1e-6 relative), so fp32 decoding packs only for models of
>= 100M parameters (models/shape_defaults.LARGE_PARAMS), where the step is bound by these
matmuls; the small models of the demo and the tests keep decoding bit for bit as the trainer
computes. The packed copies (the weights' size in their dtype) live only during generate(),
when the gradients are freed.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from reinforge.models.shape_defaults import large


def available() -> bool:
    """oneDNN's prepacked linear is in this torch build and usable."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def should_pack(model, dtype: torch.dtype) -> bool:
    """Whether a generation of `model` decoding in `dtype` packs: on a CPU with oneDNN, always
    in bf16 (bit-identical), in fp32 only for a large model (a different summation order)."""
    weight = next(model.parameters(), None)
    if weight is None or weight.device.type != "cpu" or not available():
        return False
    if dtype == torch.bfloat16:
        return True
    return dtype == torch.float32 and large(sum(p.numel() for p in model.parameters()))


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != packed.dtype:  # an input of another dtype (never in the lean loop): the plain path
        raise TypeError(f"packed linear of {packed.dtype} got a {x.dtype} input")
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _packable(module) -> torch.Tensor | None:
    """The weight `packed_linears` packs for `module`: an `nn.Linear`'s bf16 or fp32 plain-tensor
    weight (a sharded DTensor keeps its own forward); None for anything else."""
    w = getattr(module, "weight", None)
    if not isinstance(module, torch.nn.Linear) or w is None or w.dtype not in (torch.bfloat16, torch.float32):
        return None
    return w if type(w.detach()) is torch.Tensor else None


def linear_only_weights(model) -> frozenset[int]:
    """id()s of the weights `packed_linears` packs that nothing else reads during a generation
    (a tied embedding's table is read by its lookup too, so it is not one): decode_weights can
    leave them out of its whole-model copy. Empty for a PEFT-wrapped model: its LoRA layers read
    their weights' dtype to cast the input (a weight left in fp32 would make it fp32)."""
    if any(hasattr(module, "base_layer") for module in model.modules()):
        return frozenset()
    only: dict[int, bool] = {}  # parameter -> every module that holds it packs it as its weight
    for module in model.modules():
        packs = _packable(module)
        for p in module.parameters(recurse=False):
            only[id(p)] = only.get(id(p), True) and packs is p
    return frozenset(i for i, yes in only.items() if yes)


@contextmanager
def packed_linears(model, rows: int, enabled: bool = True, dtype: torch.dtype | None = None):
    """Within the block every `nn.Linear` of `model` whose weight is bf16 or fp32 computes from a
    copy of its weight reordered for `rows` input rows (a hint: other row counts, the prefill's,
    work too). A weight shared by several layers (tied embeddings) is packed once. `dtype`: pack
    a weight of another dtype as its cast to `dtype` (the bf16 decode's linear weights, which
    decode_weights.cast_weights then leaves in fp32: each one's bf16 copy lives only while it is
    packed, the same values as packing a whole-model bf16 copy). Restored on exit, exceptions
    included; `enabled=False` changes nothing."""
    if not enabled:
        yield model
        return
    patched, packs = [], {}
    try:
        with torch.no_grad():
            for module in model.modules():
                w = _packable(module)
                if w is None:
                    continue
                key = (w.data_ptr(), w.dtype, tuple(w.shape))
                if key not in packs:
                    src = w.detach() if dtype is None or w.dtype == dtype else w.detach().to(dtype)
                    packs[key] = torch.ops.mkldnn._reorder_linear_weight(src, rows)
                    del src
                bias = None if module.bias is None else module.bias.detach()
                module.forward = lambda x, p=packs[key], b=bias: _packed_forward(p, b, x)
                patched.append(module)
        yield model
    finally:
        for module in patched:
            del module.forward  # the instance attribute: the class's forward again
