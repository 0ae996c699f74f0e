"""What the reward worker gives the step (`RewardResult`, from RewardWorker.score; the reward
functions' own result is rewards/scores.py's FunctionScores). Nothing travels on an attribute of
the manager or the trainer: each call returns everything it computed, and `RewardResult.concat`
aggregates the rounds of a step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from reinforge.protocol import Batch
from reinforge.rewards.scores import merge_metrics

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
