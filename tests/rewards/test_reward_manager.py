"""RewardManager: weights, metrics, error and timeout containment, worker recovery."""

import time

import pytest

from reinforge.config.schema import RewardConfig
from reinforge.rewards import RewardError, RewardManager

USER_FNS = '''
import os, time

def slow(prompt, response, ground_truth, **extra):
    if response == "slow":
        time.sleep(60)
    return 1.0

def hang(prompt, response, ground_truth, **extra):
    if response == "sleep":
        time.sleep(10**9)
    while response == "loop":
        pass
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
        result = m.score(["1+1="] * 3, ["2", "3", "<think>a</think>2"], ["2", "2", "2"],
                         [{"data_source": "x"}] * 3)
        scores, metrics = result.scores, result.metrics
    assert scores == pytest.approx([2.5, 0.5, 1.0])  # 2*exact + 0.5 (flaky) + 0.5*format
    assert metrics["reward/exact_match/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/flaky/mean"] == 0.5 and metrics["reward/format/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/flaky/chars"] == pytest.approx((1 + 1 + 17) / 3)  # a dict's extra key, per function
    assert metrics["reward/errors"] == 0 and metrics["reward/timeouts"] == 0


def test_errors_contained_and_error_rate_in_process(fns):
    m = RewardManager([(f"{fns}:flaky", 1.0)], num_workers=0, default_score=-1.0, max_error_rate=0.5)
    result = m.score(["p"] * 4, ["ok", "boom", "bad", "ok"], [None] * 4)
    scores, metrics = result.scores, result.metrics
    assert scores == [0.5, -1.0, -1.0, 0.5] and metrics["reward/errors"] == 2
    with pytest.raises(RewardError, match=r"'flaky' failed on 3/4 .*kaboom"):
        m.score(["p"] * 4, ["boom", "boom", "bad", "ok"], [None] * 4)


def test_worker_pool_timeout_error_death_and_recovery(fns):
    m = RewardManager([(f"{fns}:slow", 1.0), (f"{fns}:flaky", 1.0), ("math_verify", 1.0)],
                      num_workers=2, timeout_s=1.0, max_error_rate=0.5)
    try:
        m.score(["p"], ["a"], ["3"])  # start the workers first: their imports are not what is timed
        start = time.monotonic()
        responses = ["slow", "boom", "die", "\\boxed{3}"]
        result = m.score(["p"] * 4, responses, ["3"] * 4)
        scores, metrics = result.scores, result.metrics
        # The 60 s sleeper was killed at 1 s, not waited for (the bound leaves room for two
        # replacement workers starting on a loaded machine).
        assert time.monotonic() - start < 30
        assert metrics["reward/timeouts"] == 1 and metrics["reward/errors"] == 2
        assert scores == pytest.approx([0.0 + 0.5 + 0, 1.0 + 0 + 0, 1.0 + 0 + 0, 1.0 + 0.5 + 1.0])
        assert m._pool.restarts == 2  # the sleeper killed, the os._exit worker replaced
        # The pool recovered: a normal batch afterwards is fully scored.
        result = m.score(["p"] * 3, ["a", "\\boxed{3}", "b"], ["3"] * 3)
        scores, metrics = result.scores, result.metrics
        assert scores == pytest.approx([1.5, 2.5, 1.5]) and metrics["reward/errors"] == 0
    finally:
        m.close()


def test_hung_user_function_times_out_with_default_workers(fns, capsys):
    """num_workers=0 (the default): a call that sleeps or loops forever is killed at timeout_s."""
    assert RewardConfig().num_workers == 0
    with RewardManager([(f"{fns}:hang", 1.0), ("exact_match", 1.0)], timeout_s=1.0) as m:
        assert m.num_workers == 0 and m.max_error_rate == RewardConfig().max_error_rate
        start = time.monotonic()
        result = m.score(["p"] * 5, ["sleep", "loop", "1", "1", "1"], ["1"] * 5)
        scores, metrics = result.scores, result.metrics
        # Two 1 s time-outs plus worker start-ups (~0.4 s each here), far from the 10^9 s sleep.
        assert time.monotonic() - start < 15
    assert scores == [0.0, 0.0, 2.0, 2.0, 2.0]  # exact_match scored in-process; hang 0 on both
    assert metrics["reward/timeouts"] == 2 and metrics["reward/errors"] == 0
    assert "reward 'hang': 2/5 calls timed out and scored 0: timed out after 1s" in capsys.readouterr().err


def test_builtins_score_in_process_without_a_pool():
    with RewardManager(["exact_match", "format", "arithmetic"]) as m:
        assert m._pool is None
        assert m.score(["p"] * 2, ["7", "<think>a</think>7"], ["7", "7"]).scores == [2.0, 1.0]
    with RewardManager(["countdown"]) as m:
        assert m._pool is None
        assert m.score(["p"], ["(3+4)*2"], [{"numbers": [2, 3, 4], "target": 14}]).scores == [1.0]


def test_bounded_function_that_overruns_in_process_scores_as_timeout():
    def sluggish(prompt, response, ground_truth, **extra):
        time.sleep(0.3)
        return 1.0

    sluggish.bounded = True  # a lambda or closure runs in-process only when it says it is bounded
    with RewardManager([(sluggish, 1.0)], timeout_s=0.1, max_error_rate=1.0) as m:
        result = m.score(["p"] * 2, ["a", "b"], [None] * 2)
        scores, metrics = result.scores, result.metrics
    assert scores == [0.0, 0.0] and metrics["reward/timeouts"] == 2


def test_batched_function_and_timeout(fns):
    with RewardManager([(f"{fns}:batched", 1.0)], num_workers=1) as m:
        assert m.score(["p"] * 2, ["ab", "abcd"], [None] * 2).scores == [2.0, 4.0]
    # The batched timeout applies with the default num_workers=0 too.
    with RewardManager([(f"{fns}:batched_slow", 1.0)], batched_timeout_s=0.2, max_error_rate=1.0) as m:
        result = m.score(["p"] * 2, ["a", "b"], [None] * 2)
        scores, metrics = result.scores, result.metrics
    assert scores == [0.0, 0.0] and metrics["reward/timeouts"] == 2


def test_unpicklable_callable_runs_in_threads_with_its_timeout(capsys):
    """A lambda cannot reach a worker process: its calls run in threads, a hung one abandoned at
    timeout_s (said once on stderr); marked bounded, it runs inline with num_workers=0."""
    def fn(p, r, g, **k):
        if r == "hang":
            time.sleep(5)
        return 1.0

    for workers in (0, 1):
        with RewardManager([(lambda p, r, g, **k: fn(p, r, g), 1.0)], num_workers=workers, timeout_s=0.3,
                           max_error_rate=1.0) as m:
            assert m._pool is None and m.fns[0].mode == "thread"
            start = time.monotonic()
            result = m.score(["p"] * 3, ["a", "hang", "b"], [None] * 3)
            scores, metrics = result.scores, result.metrics
            assert time.monotonic() - start < 3
        assert scores == [1.0, 0.0, 1.0] and metrics["reward/timeouts"] == 1
        assert "cannot be pickled" in capsys.readouterr().err
    bounded = lambda p, r, g, **k: 1.0  # noqa: E731
    bounded.bounded = True
    with RewardManager([(bounded, 1.0)], num_workers=0) as m:
        assert m.fns[0].mode == "inline" and m.score(["p"], ["r"], [None]).scores == [1.0]
