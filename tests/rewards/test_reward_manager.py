"""RewardManager: weights, metrics, error and timeout containment, worker recovery."""

import time

import pytest

from reinforge.rewards import RewardError, RewardManager

USER_FNS = '''
import os, time

def slow(prompt, response, ground_truth, **extra):
    if response == "slow":
        time.sleep(60)
    return 1.0

def flaky(prompt, response, ground_truth, **extra):
    if response == "boom":
        raise RuntimeError("kaboom")
    if response == "die":
        os._exit(3)
    if response == "bad":
        return "not a number"
    return {"score": 0.5, "chars": len(response)}

def batched(prompts, responses, ground_truths, extras):
    return [float(len(r)) for r in responses]
batched.batched = True

def batched_slow(prompts, responses, ground_truths, extras):
    time.sleep(3)
    return [0.0] * len(responses)
batched_slow.batched = True
'''


@pytest.fixture
def fns(tmp_path):
    path = tmp_path / "user_fns.py"
    path.write_text(USER_FNS)
    return str(path)


def test_weighted_sum_and_metrics_in_process(fns):
    with RewardManager([("exact_match", 2.0), (f"{fns}:flaky", 1.0), ("format", 0.5)], num_workers=0) as m:
        scores, metrics = m.score(["1+1="] * 3, ["2", "3", "<think>a</think>2"], ["2", "2", "2"],
                                  [{"data_source": "x"}] * 3)
    assert scores == pytest.approx([2.5, 0.5, 1.0])  # 2*exact + 0.5 (flaky) + 0.5*format
    assert metrics["reward/exact_match/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/flaky/mean"] == 0.5 and metrics["reward/format/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/chars"] == pytest.approx((1 + 1 + 17) / 3)
    assert metrics["reward/errors"] == 0 and metrics["reward/timeouts"] == 0


def test_errors_contained_and_error_rate_in_process(fns):
    m = RewardManager([(f"{fns}:flaky", 1.0)], num_workers=0, default_score=-1.0, max_error_rate=0.5)
    scores, metrics = m.score(["p"] * 4, ["ok", "boom", "bad", "ok"], [None] * 4)
    assert scores == [0.5, -1.0, -1.0, 0.5] and metrics["reward/errors"] == 2
    with pytest.raises(RewardError, match=r"'flaky' failed on 3/4 .*kaboom"):
        m.score(["p"] * 4, ["boom", "boom", "bad", "ok"], [None] * 4)


def test_worker_pool_timeout_error_death_and_recovery(fns):
    m = RewardManager([(f"{fns}:slow", 1.0), (f"{fns}:flaky", 1.0), ("math_verify", 1.0)],
                      num_workers=2, timeout_s=1.0, max_error_rate=0.5)
    try:
        start = time.monotonic()
        responses = ["slow", "boom", "die", "\\boxed{3}"]
        scores, metrics = m.score(["p"] * 4, responses, ["3"] * 4)
        assert time.monotonic() - start < 10  # the 60 s sleeper was killed, not waited for
        assert metrics["reward/timeouts"] == 1 and metrics["reward/errors"] == 2
        assert scores == pytest.approx([0.0 + 0.5 + 0, 1.0 + 0 + 0, 1.0 + 0 + 0, 1.0 + 0.5 + 1.0])
        assert m._pool.restarts == 2  # the sleeper killed, the os._exit worker replaced
        # The pool recovered: a normal batch afterwards is fully scored.
        scores, metrics = m.score(["p"] * 3, ["a", "\\boxed{3}", "b"], ["3"] * 3)
        assert scores == pytest.approx([1.5, 2.5, 1.5]) and metrics["reward/errors"] == 0
    finally:
        m.close()


def test_batched_function_and_timeout(fns):
    with RewardManager([(f"{fns}:batched", 1.0)], num_workers=1) as m:
        assert m.score(["p"] * 2, ["ab", "abcd"], [None] * 2)[0] == [2.0, 4.0]
    with RewardManager([(f"{fns}:batched_slow", 1.0)], num_workers=1, batched_timeout_s=0.2,
                       max_error_rate=1.0) as m:
        scores, metrics = m.score(["p"] * 2, ["a", "b"], [None] * 2)
    assert scores == [0.0, 0.0] and metrics["reward/timeouts"] == 2


def test_unpicklable_callable_rejected_for_workers():
    with pytest.raises(ValueError, match="num_workers=0"):
        RewardManager([(lambda p, r, g, **k: 1.0, 1.0)], num_workers=1)
    with RewardManager([(lambda p, r, g, **k: 1.0, 1.0)], num_workers=0) as m:
        assert m.score(["p"], ["r"], [None])[0] == [1.0]
