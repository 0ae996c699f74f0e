"""long_addition: the worked column-by-column sum, its verifier and its preference pairs, by hand."""

import random

import pytest

from reinforge.data import load_rows
from reinforge.rewards.registry import load_reward_fn
from reinforge.tasks import get_task, make_task_data
from reinforge.tasks.long_addition import final_answer, score_long_addition, worked_sum


def test_worked_sum_carries_and_leading_digit():
    # 347+585: 7+5=12 carries, 4+8+1=13 carries, 3+5+1=9 does not; no new leading digit.
    assert worked_sum(347, 585, 3) == ("7+5=12 c1;4+8+1=13 c1;3+5+1=9 c0;=932", 932)
    # 675+905: the last column carries, so the sum gains a leading 1.
    assert worked_sum(675, 905, 3) == ("5+5=10 c1;7+0+1=8 c0;6+9=15 c1;=1580", 1580)
    # A carry that ripples through a 9: 9+0+1=10 carries again.
    assert worked_sum(95, 15, 2) == ("5+5=10 c1;9+1+1=11 c1;=110", 110)
    # No carry at all: "+1" never appears.
    assert worked_sum(123, 456, 3) == ("3+6=9 c0;2+5=7 c0;1+4=5 c0;=579", 579)


def test_dropped_carry_is_wrong_by_that_column():
    # Forgetting the carry into the tens of 347+585: 4+8=12 instead of 13, so 922, not 932.
    assert worked_sum(347, 585, 3, drop_carry_at=1) == ("7+5=12 c1;4+8=12 c1;3+5+1=9 c0;=922", 922)


@pytest.mark.parametrize("response, expected", [
    ("7+5=12 c1;4+8+1=13 c1;3+5+1=9 c0;=932", 1.0),
    ("7+5=12 c1;4+8+1=13 c1;3+5+1=9 c0;= 932 ", 1.0),   # stripped
    ("7+5=11 c1;=932", 1.0),                             # only the final answer is scored
    ("7+5=12 c1;4+8+1=13 c1;3+5+1=9 c0;=933", 0.0),     # wrong final answer
    ("7+5=12 c1;4+8+1=13 c1;3+5+1=9 c0;=9320", 0.0),    # extra digit
    ("7+5=12 c1;4+8+1=13 c1;3+5+1=9", 0.0),             # truncated: the last "=" is a column's
    ("7+5=12 c1;4+8+1=13 c1;3+5+1=9 c0;=93", 0.0),      # truncated inside the answer
    ("932", 0.0),                                        # no "=" at all
    ("", 0.0),
])
def test_score(response, expected):
    assert score_long_addition("347+585=", response, "932") == expected


def test_final_answer():
    assert final_answer("1+1=2 c0;=12") == "12"
    assert final_answer("=") == ""
    assert final_answer("no equals") is None and final_answer(None) is None


def test_sample_prefs_and_registry(tmp_path):
    task = get_task("long_addition", digits=4)
    assert task.options == {"digits": 4} and task.size == 9000 * 9000
    ex = task.sample(random.Random(0))
    a, b = map(int, ex.prompt[:-1].split("+"))
    assert 1000 <= a <= 9999 and 1000 <= b <= 9999 and ex.ground_truth == str(a + b)
    assert ex.answer.count(";") == 4 and ex.answer.endswith(f"={a + b}")
    # auto routes on data_source, and the task is a reward under its own name.
    assert load_reward_fn("long_addition") is score_long_addition
    assert load_reward_fn("auto")("", ex.answer, ex.ground_truth, data_source="long_addition") == 1.0
    paths = make_task_data("long_addition", tmp_path, n_train=5, n_test=5, n_sft=40, seed=0, digits=3)
    for r in load_rows(paths["prefs"]):
        # Rejected: the same working with one carry dropped, or an off-by-one final answer.
        assert score_long_addition(r["prompt"], r["rejected"], r["ground_truth"]) == 0.0
        assert r["rejected"].count(";") == r["chosen"].count(";") == 3


@pytest.mark.parametrize("digits", [1, 13, "3"])
def test_bad_digits(digits):
    with pytest.raises(ValueError, match="digits"):
        get_task("long_addition", digits=digits)
