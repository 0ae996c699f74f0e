"""Shared helpers of the algos tests (imported by name: pytest puts this folder on sys.path)."""

import torch


def random_mask(B: int, T: int, gen: torch.Generator, empty_rows: int = 1) -> torch.Tensor:
    """Right-padded masks with random lengths, random holes (tool tokens) and empty rows."""
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    holes = torch.rand(B, T, generator=gen) < 0.2
    mask[holes] = 0.0
    mask[:empty_rows] = 0.0
    return mask
