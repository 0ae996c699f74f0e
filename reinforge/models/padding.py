"""The one padding helper: token-id lists -> a batch tensor and its mask, padded left or right.

Left padding is what generation reads (every row's last real token at L - 1: the rollout's
prompts, the judge's inputs); right padding is what training batches read (SFT, DPO, the
reward model). Kept below rewards/, workers/ and data/ so each of them pads the same way.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a batch is built: reward worker processes import data/ but never pad
    import torch

SIDES = ("left", "right")


def pad(seqs: list[list[int]], value: int, *, side: str = "right",
        length: int | None = None) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Lists of ints -> values (B, L) int64 filled with `value` where padded, and mask (B, L) int64
    (1 on the given entries). L is `length` (ValueError if a list is longer), else the longest."""
    import torch

    if side not in SIDES:
        raise ValueError(f"side={side!r}: left or right")
    L = max((len(s) for s in seqs), default=0) if length is None else length
    out = torch.full((len(seqs), L), value, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s) > L:
            raise ValueError(f"a sequence of {len(s)} tokens exceeds the padded length {L}")
        if s:
            cols = slice(L - len(s), L) if side == "left" else slice(0, len(s))
            out[i, cols] = torch.as_tensor(s, dtype=torch.long)
            mask[i, cols] = 1
    return out, mask
