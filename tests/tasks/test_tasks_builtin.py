"""Built-in tasks: seeded reproducibility, disjoint splits, verifiable answers."""

import json

import pytest

from reinforge.data import load_rows
from reinforge.rewards.builtin import exact_match as score_arithmetic  # the arithmetic task's verifier
from reinforge.tasks import TASKS, get_task, make_task_data, score_countdown
from reinforge.tasks.countdown import evaluate_expression
from reinforge.tasks.calculator import score_calculator
from reinforge.tasks.guess_number import score_guess_number
from reinforge.tasks.long_addition import score_long_addition

SCORERS = {"arithmetic": score_arithmetic, "countdown": score_countdown, "long_addition": score_long_addition,
           "calculator": score_calculator, "guess_number": score_guess_number, "count_shapes": score_arithmetic}
# Longest SFT response of each task at its default options (long_addition: 3 worked columns).
MAX_RESPONSE = {"long_addition": 39}


def _problem(row: dict) -> tuple:
    """What identifies a row's problem: the prompt text (an agent task's SFT conversation: its
    first message, tests/agents/test_calculator_task.py checks the rest) and the images' bytes."""
    prompt = row["prompt"] if isinstance(row["prompt"], str) else row["prompt"][0]["content"]
    return prompt, tuple(image["bytes"] for image in row.get("images") or ())


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_data_reproducible_disjoint_and_verifiable(tmp_path, name):
    kw = dict(n_train=60, n_test=20, n_sft=30, seed=3)
    a = make_task_data(name, tmp_path / "a", **kw)
    b = make_task_data(name, tmp_path / "b", **kw)
    c = make_task_data(name, tmp_path / "c", **{**kw, "seed": 4})
    for split in ("train", "test", "sft", "prefs"):
        assert load_rows(a[split]) == load_rows(b[split])
    assert load_rows(a["train"]) != load_rows(c["train"])

    train, test = load_rows(a["train"]), load_rows(a["test"])
    sft, prefs = load_rows(a["sft"]), load_rows(a["prefs"])
    assert (len(train), len(test), len(sft), len(prefs)) == (60, 20, 30, 30)
    test_prompts = {_problem(r) for r in test}
    assert not test_prompts & {_problem(r) for r in train}
    assert not test_prompts & {_problem(r) for r in sft}
    assert len({_problem(r) for r in train}) == 60

    row = train[0]
    assert row["data_source"] == name
    # text tasks: a plain prompt; a visual task: veRL's one user message with an <image> per image
    assert isinstance(row["prompt"], str) or row["prompt"][0]["content"].count("<image>") == len(row["images"]) == 1
    assert row["reward_model"]["style"] == "rule" and row["extra_info"]["split"] == "train"
    score = SCORERS[name]
    for r in (r for r in sft if "response" in r):
        assert score(r["prompt"], r["response"], r["ground_truth"]) == 1.0, r
        assert len(r["response"]) <= MAX_RESPONSE.get(name, 16)
    for r in prefs:
        assert r["chosen"] != r["rejected"]
        assert score(r["prompt"], r["chosen"], r["ground_truth"]) == 1.0
        assert score(r["prompt"], r["rejected"], r["ground_truth"]) == 0.0, r


def test_get_task_unknown_lists_names():
    with pytest.raises(ValueError, match="arithmetic.*countdown"):
        get_task("nope")


def test_arithmetic_options_and_too_small_space(tmp_path):
    task = get_task("arithmetic", digits=1, ops="+-")
    assert task.options == {"digits": 1, "ops": "+-"}
    with pytest.raises(ValueError, match="distinct prompts"):
        make_task_data("arithmetic", tmp_path, n_train=150, n_test=50, n_sft=10, seed=0, digits=1)
    with pytest.raises(ValueError):
        get_task("arithmetic", ops="*")


def test_arithmetic_prompt_format():
    import random

    ex = get_task("arithmetic").sample(random.Random(0))
    a, b = ex.prompt[:-1].split("+")
    assert ex.prompt.endswith("=") and len(a) == len(b) == 2 and ex.answer == str(int(a) + int(b))
    assert score_arithmetic(ex.prompt, f"  {ex.answer}\n", ex.ground_truth) == 1.0
    assert score_arithmetic(ex.prompt, ex.answer + "0", ex.ground_truth) == 0.0


GT = json.dumps({"numbers": [3, 5, 2], "target": 16})


@pytest.mark.parametrize(
    "response,expected",
    [
        ("(3+5)*2", 1.0), (" 2*(5+3) ", 1.0),
        ("3+5*2", 0.0),  # 13
        ("(3+5)*2*1", 0.0),  # extra number
        ("8*2", 0.0),  # not the given numbers
        ("(3+5)*2+0", 0.0),
        ("__import__('os').system('echo hi')", 0.0),
        ("2**3", 0.0), ("(3+5)*2 if 1 else 0", 0.0), ("3/0+5*2", 0.0), ("-3+5", 0.0),
        ("", 0.0), ("(((", 0.0), ("1" * 100_000, 0.0), ("(" * 5000 + "1" + ")" * 5000, 0.0),
    ],
)
def test_countdown_scoring(response, expected):
    assert score_countdown("3 5 2 -> 16:", response, GT) == expected
    assert score_countdown("", response, json.loads(GT)) == expected


def test_countdown_exact_division():
    gt = {"numbers": [6, 4, 3], "target": 8}
    assert score_countdown("", "6/3*4", gt) == 1.0
    assert evaluate_expression("7/2")[0] * 2 == 7  # exact fractions, no float rounding
