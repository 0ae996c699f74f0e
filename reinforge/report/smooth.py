"""Smoothing for noisy per-step curves: a centred moving average, which (unlike an EMA) does not
shift a change in the curve to later steps."""
from __future__ import annotations

import math

MAX_WINDOW = 51


def smoothing_window(n_points: int) -> int:
    """Odd window of about 1/15 of the points: 1 (drawn raw) below 30 points (validation every N
    steps, short runs), 9 for the demo's 120 steps, at most MAX_WINDOW."""
    return min(n_points // 15, MAX_WINDOW) | 1


def centred_mean(values: list[float], window: int) -> list[float]:
    """Mean of the finite values within window // 2 points either side of each point (fewer at
    the ends, where the window is cut). A non-finite point stays NaN, a gap in the curve."""
    h = window // 2
    out = []
    for i, v in enumerate(values):
        near = [u for u in values[max(0, i - h): i + h + 1] if math.isfinite(u)]
        out.append(sum(near) / len(near) if math.isfinite(v) else math.nan)
    return out
