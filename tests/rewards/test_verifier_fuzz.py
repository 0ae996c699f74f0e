"""The built-in verifiers on fuzzed responses and ground truths (benchmarks/verifier_fuzz.py at a
small count): no exception, a 0/1 score, every call bounded; plus the worst inputs by hand."""

import importlib.util
import os
import time

import pytest

from reinforge.rewards import math_verify_reward
from reinforge.rewards import builtin
from reinforge.rewards.builtin import MATH_VERIFY_BUDGET_S
from reinforge.tasks import score_countdown


def _load_bench():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "verifier_fuzz.py")
    spec = importlib.util.spec_from_file_location("verifier_fuzz", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()

# The benchmark's own criterion is 1 s per call (math_verify's budget is 0.8 s); 2 s leaves room
# for a test machine busy with other work, and still catches a missing bound (minutes).
CALL_LIMIT_S = 2.0


def test_fuzz_cases_are_seeded_and_cover_the_pathological_kinds():
    cases = bench.fuzz_cases(300, 0, "math_verify")
    assert repr(cases) == repr(bench.fuzz_cases(300, 0, "math_verify"))  # repr: a NaN ground truth != itself
    assert repr(cases) != repr(bench.fuzz_cases(300, 1, "math_verify"))
    responses = [r for r, _ in cases]
    assert any(len(r) >= 100_000 for r in responses) and any(not r.strip() for r in responses)
    assert any("\x00" in r for r in responses) and any("\\frac{\\frac{" in r for r in responses)
    assert any("\ud800" in r or "\udfff" in r for r in responses)


@pytest.mark.parametrize("name", bench.VERIFIERS)
def test_verifier_survives_fuzz(name):
    r = bench.run_verifier(name, bench.fuzz_cases(300, 0, name), budget_s=CALL_LIMIT_S)
    assert r["calls"] == 300
    assert r["crashes"] == 0, r["first_crash"]
    assert r["timeouts"] == 0, r["slow"]


@pytest.mark.parametrize("response", ["\\boxed{10^{10^{10}}}", "9**9**9**9", "\\boxed{9^{9^{9^{9}}}}",
                                      "\\boxed{(10^{100})!}", "\\sqrt{" * 300 + "2" + "}" * 300])
def test_math_verify_stops_at_its_budget(response):
    math_verify_reward("q", "\\boxed{1}", "1")  # a process's first call imports sympy, outside the budget
    start = time.monotonic()
    assert math_verify_reward("q", response, "42") == 0.0
    assert time.monotonic() - start < MATH_VERIFY_BUDGET_S + 1.0


def test_math_verify_towers_of_three_parse_and_deeper_ones_score_0_unparsed(monkeypatch):
    math_verify_reward("q", "\\boxed{1}", "1")
    assert math_verify_reward("q", "so \\boxed{256}", "2^{2^{3}}") == 1.0
    assert math_verify_reward("q", "\\boxed{2^{2^{3}}}", "256") == 1.0
    # Four levels: one uninterruptible big-integer shift in sympy took 1-2 s here, so no parse at all.
    def parsed(*args):
        raise AssertionError("a power tower of 4 levels reached math_verify's parser")

    monkeypatch.setattr(builtin, "_math_verify", parsed)
    for response, gt in [("645", "{10^{10^{10^{10}}}}"), ("\\boxed{10^{10^{10^{10}}}}", "645"),
                         ("9**9**9**9", "1"), ("\\boxed{2^{2^{2^{2}}}}", "65536")]:
        assert math_verify_reward("q", response, gt) == 0.0


def test_countdown_ground_truth_schema_errors_are_clear():
    assert score_countdown("", "9*9", '{"numbers": [9, 9], "target": 81}') == 1.0
    for bad in ['{"numbers": [1, 2]}', "[1, 2]", '{"numbers": [1, NaN], "target": 3}', "not json", None, 7]:
        with pytest.raises(ValueError, match="countdown ground truth"):
            score_countdown("", "1+2", bad)
