"""Typed results of scoring: what the reward functions give one batch (`FunctionScores`, from
RewardManager.score) and what the reward worker gives the step (`RewardResult`, from
RewardWorker.score). Nothing travels on an attribute of the manager or the trainer: each call
returns everything it computed, and `RewardResult.concat` aggregates the rounds of a step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from reinforge.protocol import Batch

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


@dataclass
class RewardResult:
    """What scoring gives the step for B sequences of T response tokens (RewardWorker.score)."""

    scores: torch.Tensor
    """(B,) float32: the sequence score, the functions' and reward model's plus every shaping term."""
    token_level_scores: torch.Tensor
    """(B, T) float32: the score on each sequence's last valid token (multi-turn: per-turn rewards
    on each turn's last generated token, the rest on the episode's last)."""
    correct: torch.Tensor
    """(B,) bool: correctness by the worker's rule (rewards.correctness), decided before shaping."""
    texts: list[str]
    """(B,) the decoded responses the functions read."""
    per_function: dict[str, torch.Tensor] = field(default_factory=dict)
    """{function name: (B,) float64 unweighted score}, nan where a TRL-style function returned None."""
    turn_rewards: list[list[float]] | None = None
    """Multi-turn: per episode, the reward placed on each turn's last token (environment plus
    per-turn function values); None for single-turn batches."""
    metrics: dict[str, float] = field(default_factory=dict)
    """reward/* metrics of these rows: means, except the counts in COUNT_METRICS."""
    weights: dict[str, int] = field(default_factory=dict)
    """The samples a mean metric is over, where fewer than B."""

    def __len__(self) -> int:
        return len(self.scores)

    def function_rows(self) -> list[dict[str, float | None]]:
        """Per sample, {function name: score, None where it did not apply} (samples/*.jsonl)."""
        cols = {k: v.tolist() for k, v in self.per_function.items()}
        return [{k: None if math.isnan(v[i]) else v[i] for k, v in cols.items()} for i in range(len(self))]

    def batch(self) -> Batch:
        """The fields the step merges: token_level_scores (B, T), seq_scores (B,), acc (B,) in
        {0., 1.}, and per sample response_text and reward_fn_scores (function_rows)."""
        return Batch({"token_level_scores": self.token_level_scores, "acc": self.correct.float(),
                      "seq_scores": self.scores},
                     {"response_text": list(self.texts), "reward_fn_scores": self.function_rows()})

    @classmethod
    def concat(cls, results: list["RewardResult"]) -> "RewardResult":
        """The rows of several results (dynamic-sampling rounds) in order, with metrics that
        describe all of them (merge_metrics: counts summed, means weighted by their samples)."""
        if len(results) == 1:
            return results[0]
        if not results:
            raise ValueError("RewardResult.concat needs at least one result")
        names = list(dict.fromkeys(k for r in results for k in r.per_function))
        nan = lambda r: torch.full((len(r),), math.nan, dtype=torch.float64)  # noqa: E731
        turns = None
        if any(r.turn_rewards is not None for r in results):
            turns = [t for r in results for t in (r.turn_rewards or [[] for _ in range(len(r))])]
        metrics, weights = merge_metrics([(r.metrics, r.weights, len(r)) for r in results])
        return cls(scores=torch.cat([r.scores for r in results]),
                   token_level_scores=torch.cat([r.token_level_scores for r in results]),
                   correct=torch.cat([r.correct for r in results]),
                   texts=[t for r in results for t in r.texts],
                   per_function={k: torch.cat([r.per_function.get(k, nan(r)) for r in results]) for k in names},
                   turn_rewards=turns, metrics=metrics, weights=weights)
