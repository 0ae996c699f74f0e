"""Reward functions written for veRL or TRL run unchanged: style detection, how each style is
called, None from TRL functions, async functions run concurrently, signature errors."""

import asyncio
import math
import time

import numpy as np
import pytest

from reinforge.config.load import ConfigError
from reinforge.rewards import RewardManager
from reinforge.rewards.registry import check_reward_signature
from reinforge.rewards.styles import ROW_KEY, calling, detect_style

USER_FNS = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """veRL: a dict with score and another key (logged)."""
    hit = solution_str.strip() == ground_truth
    return {"score": 1.0 if hit else 0.0, "bonus": 0.5 if extra_info and extra_info.get("index") == 1 else 0.0,
            "pred": solution_str}

def compute_score_no_extra(data_source, solution_str, ground_truth):
    return float(data_source == "gsm8k")

def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos):
    return [float(len(s)) for s in solution_strs]

def accuracy_reward(completions, solution, **kwargs):
    """TRL: conversational completions, a dataset column by name, None where not applicable."""
    out = []
    for c, sol in zip(completions, solution):
        if sol is None:
            out.append(None)
        else:
            out.append(1.0 if c[0]["content"].strip() == sol else 0.0)
    return out

def echo_columns(prompts, completions, completion_ids, **kwargs):
    echo_columns.seen = dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
    return [float(len(ids)) for ids in completion_ids]
echo_columns.in_process = True  # called in this process, so the test can read what it saw

def len_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]

def always_none(completions, **kwargs):
    return [None] * len(completions)
'''


@pytest.fixture
def fns(tmp_path):
    path = tmp_path / "style_fns.py"
    path.write_text(USER_FNS)
    return str(path)


def _module(fns):
    from reinforge.rewards.registry import load_reward_fn

    return {name: load_reward_fn(f"{fns}:{name}") for name in
            ("compute_score", "compute_score_no_extra", "compute_score_batch", "accuracy_reward", "echo_columns")}


def test_styles_are_detected_from_parameter_names(fns):
    m = _module(fns)
    assert detect_style(m["compute_score"]) == "verl" and not calling(m["compute_score"]).batched
    assert detect_style(m["compute_score_batch"]) == "verl" and calling(m["compute_score_batch"]).batched
    assert detect_style(m["accuracy_reward"]) == "trl" and calling(m["accuracy_reward"]).batched
    assert detect_style(lambda prompt, response, ground_truth, **extra: 0.0) == "reinforge"

    async def trl_async(prompts, completions, **kwargs):
        return []

    c = calling(trl_async)
    assert (c.style, c.batched, c.is_async, c.accepts) == ("trl", True, True, None)


def test_verl_compute_score_unchanged_with_extra_info_and_dict_metrics(fns):
    """The call that failed with "got multiple values for argument 'data_source'"."""
    extras = [{"data_source": "gsm8k", "extra_info": {"index": i}} for i in range(3)]
    with RewardManager([f"{fns}:compute_score", (f"{fns}:compute_score_no_extra", 2.0)], timeout_s=30) as m:
        result = m.score(["q"] * 3, ["4", " 4 ", "5"], ["4", "4", "4"], extras)
        scores, metrics = result.scores, result.metrics
    # compute_score: 1, 1, 0; compute_score_no_extra (weight 2): data_source is gsm8k -> 2 each.
    assert scores == [3.0, 3.0, 2.0]
    assert metrics["reward/compute_score/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/compute_score/bonus"] == pytest.approx(0.5 / 3)  # numeric keys only ("pred" is text)
    assert metrics["reward/errors"] == 0


def test_verl_batch_form_one_call(fns):
    with RewardManager([f"{fns}:compute_score_batch"]) as m:
        assert m.fns[0].call.batched and m.fns[0].mode == "pool"  # one call, in a worker process
        assert m.score(["q"] * 2, ["ab", "abc"], ["x", "y"]).scores == [2.0, 3.0]


def test_trl_conversational_columns_and_none_nan_sum(fns):
    """Raw message-list prompts -> conversational completions; the `solution` column by name;
    None leaves the term out: score = nansum(weight * value), mean over scored samples."""
    rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "solution": "2"},
            {"prompt": [{"role": "user", "content": "2+2?"}], "solution": None},
            {"prompt": [{"role": "user", "content": "3+3?"}], "solution": "6"}]
    extras = [{"data_source": "s", "solution": r["solution"], ROW_KEY: ("prompt", r)} for r in rows]
    with RewardManager([(f"{fns}:accuracy_reward", 2.0), (f"{fns}:len_reward", 0.5),
                        (f"{fns}:always_none", 1.0)]) as m:
        result = m.score(["<rendered>"] * 3, ["2", "4", "7"], ["2", None, "6"], extras)
        scores, metrics = result.scores, result.metrics
        assert result.per_function["accuracy_reward"][1] != result.per_function["accuracy_reward"][1]  # nan marks None
    # accuracy 2*[1, None, 0] + len 0.5*[1, 1, 1] (completions are message lists of length 1) + nothing.
    assert scores == [2.5, 0.5, 0.5]
    assert metrics["reward/accuracy_reward/mean"] == 0.5  # over the two samples it scored
    assert "reward/always_none/mean" not in metrics and metrics["reward/unscored"] == 0.0
    assert metrics["reward/errors"] == 0


def test_trl_plain_prompts_every_column_and_completion_ids(fns):
    rows = [{"prompt": "1+1=", "answer": "2", "level": 3}, {"prompt": "2+2=", "answer": "4", "level": 5}]
    extras = [{"data_source": "arith", "level": r["level"], ROW_KEY: ("prompt", r)} for r in rows]
    with RewardManager([f"{fns}:echo_columns"]) as m:
        result = m.score(["1+1=", "2+2="], ["2", "five"], ["2", "4"], extras, completion_ids=[[5], [6, 7, 8]])
        scores = result.scores
        seen = m.fns[0].fn.seen
    assert scores == [1.0, 3.0]
    assert seen["prompts"] == ["1+1=", "2+2="] and seen["completions"] == ["2", "five"]
    assert seen["answer"] == ["2", "4"] and seen["level"] == [3, 5] and seen["ground_truth"] == ["2", "4"]
    assert seen["data_source"] == ["arith", "arith"] and "prompt" not in seen and ROW_KEY not in seen


def test_trl_function_without_a_row_gets_prompt_text_and_extras():
    def only_named(completions, ground_truth):  # no **kwargs: only the keywords it names
        return [float(c == g) for c, g in zip(completions, ground_truth)]

    with RewardManager([only_named]) as m:
        result = m.score(["p", "q"], ["a", "b"], ["a", "c"], [{"data_source": "x", "other": 1}] * 2)
        scores, metrics = result.scores, result.metrics
    assert scores == [1.0, 0.0] and metrics["reward/unscored"] == 0.0


def test_all_none_sample_is_unscored():
    def sometimes(completions, **kwargs):  # nan reads as None, as in TRL; numpy scalars are numbers
        return [np.float32(1.0) if c == "yes" else (None if c == "no" else math.nan) for c in completions]

    with RewardManager([sometimes]) as m:
        result = m.score(["p"] * 4, ["yes", "no", "nan", "yes"], [None] * 4)
        scores, metrics = result.scores, result.metrics
    assert scores == [1.0, 0.0, 0.0, 1.0] and metrics["reward/unscored"] == 0.5
    assert metrics["reward/sometimes/mean"] == 1.0


def test_none_from_a_per_sample_function_is_an_error():
    def returns_none(prompt, response, ground_truth, **extra):
        return None

    with RewardManager([returns_none], max_error_rate=1.0) as m:
        result = m.score(["p"], ["r"], [None])
        scores, metrics = result.scores, result.metrics
    assert scores == [0.0] and metrics["reward/errors"] == 1


def test_async_per_sample_calls_run_concurrently_with_timeouts():
    """10 calls sleeping 0.3 s each finish together, not in 3 s; one that overruns times out."""
    async def slow_judge(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(5 if solution_str == "stall" else 0.3)
        return float(solution_str == ground_truth)

    with RewardManager([slow_judge], timeout_s=1.0, max_error_rate=1.0) as m:
        assert m.fns[0].mode == "async" and m._pool is None
        start = time.monotonic()
        result = m.score(["p"] * 10, ["a"] * 5 + ["b"] * 5, ["a"] * 10)
        scores, metrics = result.scores, result.metrics
        assert time.monotonic() - start < 2.0
        assert scores == [1.0] * 5 + [0.0] * 5 and metrics["reward/timeouts"] == 0
        start = time.monotonic()
        result = m.score(["p"] * 3, ["a", "stall", "a"], ["a"] * 3)
        scores, metrics = result.scores, result.metrics
        assert time.monotonic() - start < 3.0
    assert scores == [1.0, 0.0, 1.0] and metrics["reward/timeouts"] == 1


def test_async_trl_function_one_call_per_batch():
    calls = []

    async def judge(prompts, completions, **kwargs):
        calls.append(len(completions))
        await asyncio.sleep(0.01)
        return [float(len(c)) for c in completions]

    with RewardManager([judge]) as m:
        assert m.score(["p"] * 3, ["a", "bb", "ccc"], [None] * 3).scores == [1.0, 2.0, 3.0]
    assert calls == [3]


def test_forced_style_and_signature_errors(fns):
    m = _module(fns)
    check_reward_signature(m["compute_score"], "cs")  # detected verl: fine
    check_reward_signature(m["accuracy_reward"], "acc")  # trl: `solution` is a column, known at run time
    with pytest.raises(ConfigError, match=r"reward 'cs': compute_score\(.*\) cannot be called as fn\(prompts, "
                                          r"completions, completion_ids=None, \*\*kwargs\) -> list \(trl style"):
        check_reward_signature(m["compute_score"], "cs", "trl")

    def two_args(x, y):
        return 0.0

    with pytest.raises(ConfigError, match=r"two_args\(x, y\) fits no reward-function style .*"
                                          r"reinforge: fn\(prompt, response, ground_truth, \*\*extra\); "
                                          r"verl: compute_score\(data_source, solution_str.*trl: fn\(prompts, "
                                          r"completions.*set style: reinforge\|verl\|trl"):
        check_reward_signature(two_args, "f.py:two_args")

    def generic(*args, **kwargs):  # fits every style: the forced one decides how it is called
        return [1.0] * len(kwargs["completions"]) if "completions" in kwargs else 2.0

    with RewardManager([(generic, 1.0, "trl"), (generic, 1.0, "reinforge")], num_workers=0) as mgr:
        assert [f.call.style for f in mgr.fns] == ["trl", "reinforge"]
        assert mgr.score(["p"], ["r"], [None]).scores == [3.0]
