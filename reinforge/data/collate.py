"""Right padding of token-id lists into batch tensors, shared by every collate function."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a batch is built, not at package import
    import torch


def pad_right(seqs: list[list[int]], pad_value: int) -> "torch.Tensor":
    """(B, L) int64 tensor, each sequence right-padded to the longest."""
    import torch  # imported on use: reward worker processes import this package but never collate

    length = max(len(s) for s in seqs)
    out = torch.full((len(seqs), length), pad_value, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out
