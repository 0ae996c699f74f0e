"""RewardResult: rounds concatenate with metrics describing every row; the correctness rule."""
from __future__ import annotations

import math

import pytest
import torch

from reinforge.rewards.correctness import CorrectnessRule, correctness_rule
from reinforge.rewards.manager import RewardManager
from reinforge.rewards.result import RewardResult


def _result(scores: list[float], metrics: dict, weights: dict | None = None) -> RewardResult:
    s = torch.tensor(scores)
    fn = torch.tensor([math.nan if x < 0 else x for x in scores], dtype=torch.float64)
    return RewardResult(s, s[:, None].repeat(1, 3), s > 0.5, [str(x) for x in scores], {"f": fn}, None, metrics,
                        weights or {})


def test_concat_sums_counts_and_weights_means_by_their_samples():
    a = _result([1.0, 0.0], {"reward/errors": 1.0, "reward/f/mean": 0.5, "reward/format_ok_frac": 1.0})
    # 3 rows, the function applied to 1 of them
    b = _result([1.0, -1.0, -1.0], {"reward/errors": 2.0, "reward/f/mean": 1.0, "reward/format_ok_frac": 0.0},
                {"reward/f/mean": 1})
    both = RewardResult.concat([a, b])
    assert len(both) == 5 and both.texts == ["1.0", "0.0", "1.0", "-1.0", "-1.0"]
    assert both.metrics["reward/errors"] == 3.0  # a count: summed
    assert both.metrics["reward/f/mean"] == pytest.approx((0.5 * 2 + 1.0 * 1) / 3)  # over the 3 scored samples
    assert both.metrics["reward/format_ok_frac"] == pytest.approx(2 / 5)  # over all 5 rows
    assert both.weights == {"reward/f/mean": 3}
    assert both.batch()["reward_fn_scores"] == [{"f": 1.0}, {"f": 0.0}, {"f": 1.0}, {"f": None}, {"f": None}]
    assert both.batch()["acc"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert RewardResult.concat([a]) is a


def test_correctness_rule_reported_acc_wins_then_threshold():
    rule = CorrectnessRule()
    scores = torch.tensor([0.9, 0.2, 0.9, 0.5])
    assert rule(scores).tolist() == [True, False, True, False]  # > 0.5
    assert rule(scores, [None, True, False, None]).tolist() == [True, True, False, False]

    def strict(prompt, response, ground_truth, **extra):
        return 0.9

    strict.correct_threshold = 0.95
    assert correctness_rule([("strict", strict)]) == CorrectnessRule(0.95, "strict")
    other = lambda p, r, g, **k: 1.0  # noqa: E731
    other.correct_threshold = 0.5
    with pytest.raises(ValueError, match="declare different correctness thresholds"):
        correctness_rule([("strict", strict), ("other", other)])


def test_manager_reads_acc_from_dict_results():
    def graded(prompt, response, ground_truth, **extra):
        return {"score": 0.7, "acc": response == ground_truth}

    graded.bounded = True
    with RewardManager([(graded, 1.0)], num_workers=0) as m:
        out = m.score(["p"] * 2, ["a", "b"], ["a", "a"])
    assert out.scores == [0.7, 0.7] and out.reported_correct == [True, False]
    assert out.metrics["reward/graded/acc"] == 0.5 and out.per_function == {"graded": [0.7, 0.7]}
