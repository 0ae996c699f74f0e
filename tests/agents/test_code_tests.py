"""The code_tests reward on veRL's code-dataset ground truths (stdin/stdout, call-based, asserts)."""
from __future__ import annotations

import json

import pytest

from reinforge.rewards import load_reward_fn
from reinforge.rewards.code_tests import code_tests, extract_code, parse_tests

ADD = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}


def test_stdio_tests_from_a_fenced_block():
    response = "Read two numbers:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone."
    assert code_tests("", response, ADD) == {"score": 1.0, "pass_rate": 1.0}
    # JSON text, as veRL's parquet files store it; one case of two fails
    wrong = "a, b = map(int, input().split())\nprint(a - b if a > 2 else a + b)"
    assert code_tests("", wrong, json.dumps(ADD)) == {"score": 0.0, "pass_rate": 0.5}
    # whitespace between tokens does not matter; exit() after printing is a normal end
    assert code_tests("", "import sys\nprint(' ', sum(map(int, sys.stdin.buffer.read().split())))\nexit()",
                      ADD)["score"] == 1.0


def test_call_based_tests_with_fn_name():
    truth = {"fn_name": "pair", "inputs": [[1, 2], [3, 4]], "outputs": [[1, 2], [[3, 4]]]}
    assert code_tests("", "def pair(a, b):\n    return (a, b)", truth)["score"] == 1.0  # tuple == list
    leetcode = "class Solution:\n    def pair(self, a, b):\n        return [a, b]"
    assert code_tests("", leetcode, truth)["score"] == 1.0
    assert code_tests("", "def other(a, b):\n    return 0", truth) == {"score": 0.0, "pass_rate": 0.0}


def test_assert_lists_and_failures_that_score_zero():
    asserts = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
    assert code_tests("", "def add(a, b):\n    return a + b", asserts)["score"] == 1.0
    assert code_tests("", "def add(a, b):\n    return 3", asserts)["pass_rate"] == 0.5
    assert code_tests("", "this is not python", asserts)["score"] == 0.0
    # a case that loops forever fails at its alarm; the other case still passes
    looping = "def add(a, b):\n    while a == 1:\n        pass\n    return a + b"
    assert code_tests("", looping, asserts) == {"score": 0.0, "pass_rate": 0.5}


def test_the_code_cannot_read_the_expected_outputs():
    cheat = "import os\nprint(os.path.exists('tests.json'), os.listdir('.'))"
    assert code_tests("", cheat, {"inputs": [""], "outputs": ["True"]})["score"] == 0.0


def test_extract_code_and_bad_ground_truths():
    assert extract_code("```\nplain\n```\n```python\nlast\n```") == "last\n"
    assert extract_code("```\nonly\n```") == "only\n" and extract_code("print(1)") == "print(1)"
    with pytest.raises(ValueError, match="ground truth must be"):
        parse_tests({"inputs": [1]})
    with pytest.raises(ValueError, match="2 inputs and 1 outputs"):
        parse_tests({"inputs": [1, 2], "outputs": [1]})
    assert load_reward_fn("code_tests") is code_tests and code_tests.bounded
