"""Correctness (`acc`): which responses count as right, a rule chosen once per reward worker.

Per sample, in this order:
1. a reward function that returns {"score": s, "acc": bool} (veRL's convention) decides: the
   sample is correct when every function that reported `acc` for it says so. A function that
   scores several tasks (data sources) can so apply each task's own rule;
2. otherwise the threshold rule: the rule-based score (the reward functions' weighted sum plus
   an environment's turn rewards, before the reward model and the shaping terms, so that
   length-vs-correctness diagnostics are not confused by penalties) above a threshold. A
   function declares its threshold with `fn.correct_threshold = t` (functions that declare one
   must agree); without a declaration it is DEFAULT_THRESHOLD, right for 0/1 verifiers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

DEFAULT_THRESHOLD = 0.5


@dataclass(frozen=True)
class CorrectnessRule:
    """Correct when a function reported so, else when the rule-based score exceeds `threshold`."""

    threshold: float = DEFAULT_THRESHOLD
    """Rule-based scores above it count as correct (where no function reported `acc`)."""
    declared_by: str | None = None
    """The reward function that declared the threshold; None: the default."""

    def __call__(self, rule_scores: torch.Tensor, reported: list[bool | None] | None = None) -> torch.Tensor:
        """rule_scores (B,) float, reported (B,) True/False/None -> (B,) bool."""
        by_score = rule_scores > self.threshold
        if not reported or all(r is None for r in reported):
            return by_score
        return torch.tensor([bool(s) if r is None else r for s, r in zip(by_score.tolist(), reported)])


def correctness_rule(functions: Iterable[tuple[str, Callable]]) -> CorrectnessRule:
    """The rule of a worker's reward functions ((name, callable) pairs): the one threshold they
    declare (`correct_threshold`), else the default. ValueError when two declare different ones."""
    rule = CorrectnessRule()
    for name, fn in functions:
        t = getattr(fn, "correct_threshold", None)
        if t is None:
            continue
        if rule.declared_by is not None and float(t) != rule.threshold:
            raise ValueError(f"reward functions '{rule.declared_by}' and '{name}' declare different correctness "
                             f"thresholds ({rule.threshold:g}, {float(t):g}); return {{'score': s, 'acc': bool}} "
                             f"from them instead")
        rule = CorrectnessRule(float(t), name)
    return rule
