"""Reward functions written for veRL and TRL, run unchanged (issue 22): veRL's per-dataset
scorers get only the arguments they name; a TRL function that calls math_verify with its
default (signal-based) timeouts runs on a worker's main thread; a function that hangs stops its
batch after a few deadlines, not one per sample (pool.Schedule)."""
from __future__ import annotations

import math
import time

import pytest

from reinforge.config.load import ConfigError
from reinforge.config.schema import RewardConfig
from reinforge.rewards import RewardError, RewardManager
from reinforge.rewards.pool import BURST_WORKERS, OK, SKIPPED, TIMEOUT, Schedule, hopeless
from reinforge.rewards.registry import check_reward_signature, load_reward_fn

# Written the way veRL's own scorers are (verl/utils/reward_score/gsm8k.py, math_dapo.py): no
# data_source, no extra_info, options with defaults. Our code, not copies.
VERL_SCORERS = r'''
import re

def gsm8k_like(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    found = re.findall(r"#### (-?[0-9.,]+)", solution_str)
    if not found:
        return 0.0
    return score if found[-1].replace(",", "") == ground_truth else format_score

def dapo_like(solution_str, ground_truth, strict_box_verify=False, pause_tokens_index=None):
    boxed = re.findall(r"\\boxed\{([^}]*)\}", solution_str)
    pred = boxed[-1] if boxed else "[INVALID]"
    correct = pred == ground_truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}

def everything(data_source, solution_str, ground_truth, **kwargs):
    return float(len(kwargs))  # extra_info arrives through **kwargs

def needs_tokenizer(solution_str, ground_truth, tokenizer):
    return 0.0
'''

# A TRL-docs-style accuracy reward: math_verify's parse / verify with their default timeouts,
# which arm signal.alarm and so need a main thread.
TRL_MATH = r'''
from math_verify import parse, verify

def accuracy_reward(completions, solution, **kwargs):
    rewards = []
    for completion, sol in zip(completions, solution):
        gold = parse(sol)
        rewards.append(float(verify(gold, parse(completion))) if gold else None)
    return rewards
'''

HANG = '''
import time

def hang(prompt, response, ground_truth, **extra):
    time.sleep(3600)
'''


def _file(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_verl_dataset_scorers_get_the_arguments_they_name(tmp_path):
    """The calls that failed with "got an unexpected keyword argument 'data_source'"."""
    fns = _file(tmp_path, "scorers.py", VERL_SCORERS)
    for name in ("gsm8k_like", "dapo_like", "everything"):
        check_reward_signature(load_reward_fn(f"{fns}:{name}"), name)  # what preflight runs
    with pytest.raises(ConfigError, match=r"needs_tokenizer\(solution_str, ground_truth, tokenizer\) cannot be "
                                          r"called as compute_score.*verl style.*'tokenizer'"):
        check_reward_signature(load_reward_fn(f"{fns}:needs_tokenizer"), "needs_tokenizer")

    responses = ["so 70 + 2 = 72\n#### 72", "#### 7", "\\boxed{72}"]
    extras = [{"data_source": "openai/gsm8k", "extra_info": {"index": i}} for i in range(3)]
    with RewardManager([f"{fns}:gsm8k_like", f"{fns}:dapo_like", (f"{fns}:everything", 10.0)],
                       timeout_s=30) as m:
        result = m.score(["q"] * 3, responses, ["72"] * 3, extras)
    assert result.per_function["gsm8k_like"] == [1.0, 0.0, 0.0]  # strict "#### 72" only
    assert result.per_function["dapo_like"] == [-1.0, -1.0, 1.0]  # the last \boxed{} only
    assert result.per_function["everything"] == [1.0] * 3  # data_source named; extra_info via **kwargs
    assert result.scores == [1.0 - 1.0 + 10.0, 0.0 - 1.0 + 10.0, 0.0 + 1.0 + 10.0]
    assert result.reported_correct == [False, False, True]  # dapo_like's "acc"
    assert result.metrics["reward/dapo_like/acc"] == pytest.approx(1 / 3)  # "pred" (text) is not logged
    assert result.metrics["reward/errors"] == 0


def test_trl_math_verify_with_default_timeouts_runs_in_a_worker(tmp_path):
    """TRL calls batched functions on the main thread; so does a reward worker process."""
    fns = _file(tmp_path, "trl_math.py", TRL_MATH)
    responses = ["The answer is $\\frac{1}{2}$", "$0.5$", "$3$"]
    rows = [{"solution": "$\\frac{1}{2}$"}] * 2 + [{"solution": "no math here"}]
    with RewardManager([f"{fns}:accuracy_reward"], timeout_s=30) as m:
        assert m.fns[0].call.batched and m.fns[0].mode == "pool"
        result = m.score(["q"] * 3, responses, [None] * 3, rows)
    assert result.per_function["accuracy_reward"][:2] == [1.0, 1.0]  # 1/2 == 0.5, both parsed
    assert math.isnan(result.per_function["accuracy_reward"][2])  # no gold answer: None, not applicable
    assert result.metrics["reward/errors"] == 0


def test_trl_math_verify_in_a_thread_says_how_to_fix_it(tmp_path):
    """A function no worker can import (a closure here, or one defined in the script run) stays
    in a thread, where math_verify's signal timeouts fail: the error names the fix."""
    accuracy = load_reward_fn(f"{_file(tmp_path, 'trl_math.py', TRL_MATH)}:accuracy_reward")

    def local_accuracy(completions, solution, **kwargs):
        return accuracy(completions, solution, **kwargs)

    with RewardManager([local_accuracy], timeout_s=30) as m:
        assert m.fns[0].mode == "thread"
        with pytest.raises(RewardError, match=r"failed on 2/2 .*signal\.alarm.*\[reinforge: this function runs in a "
                                              r"thread \(it cannot be pickled.*'path/file\.py:fn'.*parsing_timeout=None"):
            m.score(["q"] * 2, ["$1$", "$2$"], [None] * 2, [{"solution": "$1$"}] * 2)


def _simulate(durations: list[float], timeout_s: float, num_workers: int, max_error_rate: float):
    """Drive Schedule as TimeoutPool.run does, on a simulated clock: call i takes durations[i]
    seconds (inf: never returns) and is killed at timeout_s. -> (seconds until the run ends,
    [(status, value)])."""
    plan, now, running = Schedule(len(durations), num_workers, max_error_rate), 0.0, []  # (end, task)
    while not plan.done(len(running)):
        while len(running) < plan.limit():
            t = plan.next_task()
            if t is None:
                break
            running.append((now + min(durations[t], timeout_s), t))
        now = min(end for end, _ in running)
        for end, t in [r for r in running if r[0] <= now]:
            plan.finish(t, TIMEOUT if durations[t] > timeout_s else OK, 1.0)
        running = [r for r in running if r[0] > now]
    return now, plan.results()


def test_a_hung_function_stops_its_batch_after_two_deadlines_at_the_defaults():
    """With the defaults (timeout_s=10, one worker, max_error_rate=0.5) a function that never
    returns failed 16 samples one after another (160 s). Now: after the first time-out the other
    15 calls run side by side (BURST_WORKERS), so the batch fails at the second deadline (20 s);
    256 samples stop after 9 deadlines (1 + 128/16) with the 127 calls left unmade."""
    d = RewardConfig()
    timeout, workers, rate = d.timeout_s, max(1, d.num_workers), d.max_error_rate
    assert (timeout, workers, rate, BURST_WORKERS) == (10.0, 1, 0.5, 16)
    seconds, results = _simulate([math.inf] * 16, timeout, workers, rate)
    assert seconds == 2 * timeout and [s for s, _ in results] == [TIMEOUT] * 16
    seconds, results = _simulate([math.inf] * 256, timeout, workers, rate)
    statuses = [s for s, _ in results]
    assert seconds == 9 * timeout and statuses.count(TIMEOUT) == 1 + 8 * 16 and statuses.count(SKIPPED) == 127
    # A batch that can still pass runs to the end: 8 of 16 hung is exactly max_error_rate.
    seconds, results = _simulate([math.inf] * 8 + [0.1] * 8, timeout, workers, rate)
    assert [s for s, _ in results] == [TIMEOUT] * 8 + [OK] * 8 and seconds == 2 * timeout
    # Without time-outs the pool keeps num_workers: errors alone stop the batch at the 9th.
    plan = Schedule(16, 1, 0.5)
    for _ in range(8):
        plan.finish(plan.next_task(), "error", "boom")
    assert not plan.stopped and plan.limit() == 1
    plan.finish(plan.next_task(), "error", "boom")
    assert plan.stopped and plan.next_task() is None and plan.done(busy=0)
    assert [s for s, _ in plan.results()].count(SKIPPED) == 7
    assert not hopeless(8, 16, 0.5) and hopeless(9, 16, 0.5) and not hopeless(16, 16, None)


def test_a_hung_function_in_real_workers_stops_early(tmp_path):
    """The real pool at the defaults but a 1 s deadline: 32 hung samples took 32 s; now the
    first time-out, then 16 side by side (17 > 0.5 x 32 failures), plus the workers' start-up
    (forked from a fork server that has imported reinforge's reward modules: ~2.5 s in all here)."""
    spec = f"{_file(tmp_path, 'hang.py', HANG)}:hang"
    with RewardManager([spec], timeout_s=1.0) as m:
        assert m.num_workers == 0 and m.max_error_rate == 0.5
        start = time.monotonic()
        with pytest.raises(RewardError, match=r"'hang' failed on 17/32 samples, 15 more not scored once that many "
                                              r"had failed \(max_error_rate=0.5\); first failure: timed out after 1s"):
            m.score(["p"] * 32, ["r"] * 32, ["g"] * 32)
        assert time.monotonic() - start < 10  # a third of the 32 s of one time-out after another
        assert len(m._pool._workers) == 1  # the burst workers are gone after the batch
