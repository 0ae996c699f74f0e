"""`countdown`: "3 5 2 -> 16:" -> "(3+5)*2", using each given number exactly once.

The verifier never evaluates the response as code: reinforge.safe_eval checks the characters
against a whitelist, parses with `ast`, walks only number / + - * / nodes and computes with
exact fractions, so "__import__('os')" or "2**999999" scores 0 without running anything.
"""

from __future__ import annotations

import functools
import json
import operator
import random
from fractions import Fraction

from reinforge.safe_eval import ExpressionError, Grammar, evaluate
from reinforge.tasks.base import Example, Task

MAX_RESPONSE_CHARS = 64  # generated solutions are <= ~16 chars; anything far longer is wrong
# Integers, + - * / and parentheses only (no unary minus, no **), computed as exact fractions.
GRAMMAR = Grammar(binary=("+", "-", "*", "/"), unary=(), floats=False, exact=True,
                  chars=frozenset("0123456789+-*/() "), max_chars=MAX_RESPONSE_CHARS)
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def evaluate_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and the literals used by an arithmetic expression, or None if not one."""
    try:
        return evaluate(text, GRAMMAR)
    except ExpressionError:
        return None


def parse_ground_truth(ground_truth) -> tuple[list[int], int]:
    """(numbers, target) from a dict or its JSON string; ValueError naming the shape otherwise."""
    try:
        gt = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
        return [int(n) for n in gt["numbers"]], int(gt["target"])
    except (ValueError, TypeError, KeyError, OverflowError) as exc:  # NaN / Infinity are valid JSON
        raise ValueError('countdown ground truth must be {"numbers": [int, ...], "target": int} or its JSON, '
                         f"got {str(ground_truth)[:80]!r}") from exc


def score_countdown(prompt: str, response: str, ground_truth, **extra) -> float:
    """1.0 when `response` uses exactly the given numbers (each once) and equals the target."""
    numbers, target = parse_ground_truth(ground_truth)
    result = evaluate_expression(response)
    if result is None:
        return 0.0
    value, used = result
    return 1.0 if value == target and sorted(used) == sorted(numbers) else 0.0


score_countdown.bounded = True  # MAX_RESPONSE_CHARS caps the parse; RewardManager may run it in-process


def _combine(op: str, left: tuple[Fraction, str, str], right: tuple[Fraction, str, str]):
    """Apply `op` to two (value, text, top-level op) triples, adding only needed parentheses."""
    (lv, lt, lop), (rv, rt, rop) = left, right
    if op == "/" and (rv == 0 or (lv / rv).denominator != 1):
        return None  # exact integer division only, so every intermediate value is an integer
    if op in "*/" and lop in ("+", "-"):
        lt = f"({lt})"
    # The right operand needs parentheses unless the operator is associative over it.
    if (op == "-" and rop in ("+", "-")) or (op == "*" and rop in ("+", "-")) or (op == "/" and rop):
        rt = f"({rt})"
    value = _OPS[op](lv, rv)
    return value, f"{lt}{op}{rt}", op


def _random_expression(rng: random.Random, nums: list[int], ops: str):
    """A random expression tree over `nums` in order, or None if a division was inexact."""
    if len(nums) == 1:
        return Fraction(nums[0]), str(nums[0]), ""
    split = rng.randint(1, len(nums) - 1)
    left = _random_expression(rng, nums[:split], ops)
    right = _random_expression(rng, nums[split:], ops)
    if left is None or right is None:
        return None
    return _combine(rng.choice(ops), left, right)


def _sample(rng: random.Random, count: int, max_number: int, max_target: int, ops: str) -> Example:
    for _ in range(1000):
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        order = numbers[:]
        rng.shuffle(order)
        expr = _random_expression(rng, order, ops)
        if expr is None or not (1 <= expr[0] <= max_target):
            continue
        target = int(expr[0])
        wrong = _wrong_expression(rng, numbers, target, ops)
        gt = json.dumps({"numbers": numbers, "target": target})
        prompt = " ".join(map(str, numbers)) + f" -> {target}:"
        return Example(prompt=prompt, answer=expr[1], ground_truth=gt, wrong=wrong)
    raise RuntimeError("countdown: could not generate a valid problem; loosen max_target")


def _wrong_expression(rng: random.Random, numbers: list[int], target: int, ops: str) -> str:
    """A well-formed expression over the same numbers whose value misses the target."""
    for _ in range(100):
        order = numbers[:]
        rng.shuffle(order)
        expr = _random_expression(rng, order, ops)
        if expr is not None and expr[0] != target:
            return expr[1]
    # Every arrangement hits the target (e.g. "1 1 1" with only "*"): use a wrong number instead.
    return "+".join(map(str, numbers[:-1] + [numbers[-1] + 1]))


def make_countdown(count: int = 3, max_number: int = 9, max_target: int = 100, ops: str = "+-*/") -> Task:
    """Reach `target` (1..max_target) from `count` numbers in 1..max_number with `ops`."""
    if not 2 <= count <= 6:
        raise ValueError(f"countdown: count must be in 2..6, got {count!r}")
    if not 1 <= max_number <= 99:
        raise ValueError(f"countdown: max_number must be in 1..99, got {max_number!r}")
    if not ops or set(ops) - set(_OPS):
        raise ValueError(f"countdown: ops must be made of '+-*/', got {ops!r}")
    return Task(
        name="countdown",
        ability="arithmetic",
        sample=functools.partial(_sample, count=count, max_number=max_number, max_target=max_target, ops=ops),
        score=score_countdown,
        options={"count": count, "max_number": max_number, "max_target": max_target, "ops": ops},
    )
