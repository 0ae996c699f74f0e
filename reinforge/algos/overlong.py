"""DAPO soft overlong punishment (https://arxiv.org/abs/2503.14476, section 3.4)."""

from __future__ import annotations

import torch


def soft_overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """Length-dependent reward penalty. lengths (B,) response lengths -> (B,) float penalties.

    0 when L <= max_len - buffer_len; -(L - (max_len - buffer_len)) / buffer_len * factor
    inside the buffer (linear, reaching -factor at L = max_len); -factor beyond max_len.
    """
    if buffer_len <= 0 or buffer_len > max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    L = lengths.float() if not lengths.is_floating_point() else lengths
    expected = max_len - buffer_len
    ramp = -(L - expected) / buffer_len * penalty_factor
    out = torch.where(L <= expected, torch.zeros_like(L), ramp)
    return torch.where(L > max_len, torch.full_like(L, -penalty_factor), out)
