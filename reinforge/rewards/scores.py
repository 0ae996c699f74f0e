"""What the reward functions give one batch (`FunctionScores`, from RewardManager.score) and how
reward metrics of several batches combine. Torch-free: reward worker processes import the
manager's package and must start fast.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ACC_KEY = "acc"  # the key of a reward dict that reports correctness (veRL's convention)

# Metrics that count events (failed calls) in the rows scored; every other reward metric is a
# mean over samples, so several rounds add the counts and average the means.
COUNT_METRICS = ("reward/errors", "reward/timeouts")


def merge_metrics(parts: list[tuple[dict[str, float], dict[str, int], int]]) -> tuple[dict[str, float], dict[str, int]]:
    """Metrics of several scored batches as if scored at once: COUNT_METRICS summed, every other
    one averaged, weighted by the samples it is a mean over (its weights entry, else the batch's
    rows). parts: (metrics, weights, rows) per batch -> (metrics, weights)."""
    totals: dict[str, float] = {}
    weights: dict[str, int] = {}
    for metrics, w, rows in parts:
        for k, v in metrics.items():
            n = 1 if k in COUNT_METRICS else w.get(k, rows)
            totals[k] = totals.get(k, 0.0) + (v if k in COUNT_METRICS else v * n)
            weights[k] = weights.get(k, 0) + n
    out = {k: v if k in COUNT_METRICS else (v / weights[k] if weights[k] else 0.0) for k, v in totals.items()}
    rows = sum(r for *_, r in parts)
    return out, {k: n for k, n in weights.items() if k not in COUNT_METRICS and n != rows}


@dataclass
class FunctionScores:
    """The reward functions' scores of one batch of B samples (RewardManager.score)."""

    scores: list[float]
    """(B,) sum over functions of weight x score (a function that did not apply left out)."""
    metrics: dict[str, float]
    """reward/<fn>/mean, reward/<fn>/<key>, reward/unscored (means), reward/errors, reward/timeouts (counts)."""
    per_function: dict[str, list[float]] = field(default_factory=dict)
    """{function name: (B,) its unweighted score}, nan where a TRL-style function returned None."""
    turn_scores: list[list[float] | None] | None = None
    """Multi-turn: per sample, the weighted per-turn values of functions that returned one value
    per turn (None for a sample where none did); None without trajectories."""
    reported_correct: list[bool | None] = field(default_factory=list)
    """(B,) correctness that functions reported ({"score": s, "acc": bool}, veRL's convention):
    True when every function that reported one said so, None where none did."""
    weights: dict[str, int] = field(default_factory=dict)
    """The samples a mean metric is over, where fewer than B (a function that scored only some)."""
