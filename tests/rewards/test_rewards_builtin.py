"""Built-in reward functions on hand-written responses, and the spec loader."""

import pytest

from reinforge.rewards import (BUILTIN_REWARDS, exact_match, format_reward, load_reward_fn, math_verify_reward,
                               soft_overlong_punishment)

HUGE = "9" * 100_000


@pytest.mark.parametrize(
    "response,gt,expected",
    [
        ("Adding them, the answer is \\boxed{42}.", "42", 1.0),
        ("The answer is \\boxed{42}.", "\\boxed{42}", 1.0),
        ("... so she has 1,000 left.\n#### 1,000", "1000", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{2}{4}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{41}", "42", 0.0),
        ("#### 43", "42", 0.0),
        ("so 42 ####", "42", 0.0),  # "####" with no answer after it: an empty box, not the 42 before it
        ("\\boxed{", "42", 0.0),
        ("\\boxed{4", "42", 0.0),
        ("}}}{{{\\boxed{}", "42", 0.0),
        ("", "42", 0.0),
        (HUGE, "42", 0.0),
        ("x" * 100_000 + " \\boxed{42}", "42", 1.0),
    ],
)
def test_math_verify(response, gt, expected):
    assert math_verify_reward("q", response, gt) == expected


def test_exact_match_and_format():
    assert exact_match("", " 82\n", "82") == 1.0 and exact_match("", "82.0", "82") == 0.0
    assert exact_match("", HUGE, "82") == 0.0 and exact_match("", "7", 7) == 1.0
    assert format_reward("", "<think>add 3 and 4</think> 7") == 1.0
    assert format_reward("", "\n<think>\n</think>\nanswer") == 1.0
    for bad in ["7", "<think>x</think>", "<think>x</think>   ", "<think>x 7", "x</think>7",
                "<think>a</think>7<think>b</think>8", "<think>" * 50_000, HUGE]:
        assert format_reward("", bad) == 0.0, bad[:40]


def test_soft_overlong_punishment():
    f = lambda n: soft_overlong_punishment(n, max_len=100, buffer_len=20, factor=1.0)  # noqa: E731
    assert f(50) == 0.0 and f(80) == 0.0
    assert f(90) == pytest.approx(-0.5) and f(100) == pytest.approx(-1.0) and f(150) == -1.0
    assert soft_overlong_punishment(90, 100, 20, factor=0.5) == pytest.approx(-0.25)
    with pytest.raises(ValueError):
        soft_overlong_punishment(1, 10, 0)


def test_load_reward_fn_specs(tmp_path):
    assert set(BUILTIN_REWARDS) >= {"math_verify", "exact_match", "format", "arithmetic", "countdown"}
    assert load_reward_fn("exact_match") is exact_match
    assert load_reward_fn("reinforge.rewards.builtin:format_reward") is format_reward
    assert load_reward_fn("reinforge.rewards.builtin.format_reward") is format_reward
    (tmp_path / "my_reward.py").write_text("def length_bonus(prompt, response, ground_truth, **kw):\n"
                                           "    return {'score': 1.0, 'length': len(response)}\n")
    fn = load_reward_fn(f"{tmp_path}/my_reward.py:length_bonus")
    assert fn("p", "abc", None) == {"score": 1.0, "length": 3}
    with pytest.raises(ValueError, match="exact_match"):
        load_reward_fn("no_such_reward")
    with pytest.raises(ValueError, match="cannot import"):
        load_reward_fn("no_such_pkg.mod:fn")
    with pytest.raises(ValueError, match="not a callable"):
        load_reward_fn(f"{tmp_path}/my_reward.py:missing")
    with pytest.raises(ValueError, match="not found"):
        load_reward_fn(f"{tmp_path}/absent.py:fn")


def test_task_rewards_through_registry():
    arith, countdown = load_reward_fn("arithmetic"), load_reward_fn("countdown")
    assert arith("37+45=", "82", "82") == 1.0 and arith("37+45=", "83", "82") == 0.0
    assert arith("37+45=", HUGE, "82") == 0.0 and arith("37+45=", "", "82") == 0.0
    gt = {"numbers": [3, 5, 2], "target": 16}
    assert countdown("", "(3+5)*2", gt) == 1.0
    for bad in ["__import__('os')", "(3+5)*2; import os", "lambda: 16", HUGE, "", "(3+5)*2)"]:
        assert countdown("", bad, gt) == 0.0


def test_task_rewards_come_from_tasks():
    from reinforge.tasks import TASKS, get_task

    for name in TASKS:  # every built-in task is a reward under its name, and `auto` routes to it
        assert load_reward_fn(name) is get_task(name).score
    assert load_reward_fn("arithmetic") is exact_match
    auto = load_reward_fn("auto")
    assert auto("", " 82 ", "82", data_source="Arithmetic") == 1.0 and auto("", "83", "82", data_source="arithmetic") == 0.0


@pytest.mark.parametrize("first", ["reinforge.tasks", "reinforge.tasks.arithmetic", "reinforge.rewards"])
def test_tasks_and_rewards_import_in_any_order(first):
    import subprocess
    import sys

    code = (f"import {first}\nimport reinforge.rewards, reinforge.tasks\n"
            "assert reinforge.tasks.get_task('arithmetic').score is reinforge.rewards.exact_match")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_auto_reward_dispatches_on_data_source():
    auto = load_reward_fn("auto")
    assert auto("", "(3+5)*2", '{"numbers": [3, 5, 2], "target": 16}', data_source="countdown") == 1.0
    assert auto("", "so \\boxed{\\frac{1}{2}}", "0.5", data_source="openai/gsm8k") == 1.0
    assert auto("", "0.50", "0.5", data_source="custom") == 0.0  # exact match elsewhere
    assert auto("", "82", "82") == 1.0
