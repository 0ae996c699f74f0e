"""`arithmetic`: "37+45=" -> "82". Small enough for a ~3M-parameter model to learn on a CPU."""

from __future__ import annotations

import functools
import random

from reinforge.tasks.base import Example, Task


def _operand_range(digits: int) -> tuple[int, int]:
    # 1 digit includes 0; wider operands have no leading zero ("07" is not a 2-digit number).
    return (0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _sample(rng: random.Random, digits: int, ops: str) -> Example:
    lo, hi = _operand_range(digits)
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    op = rng.choice(ops)
    if op == "-" and a < b:
        a, b = b, a  # keep answers non-negative: no sign token to learn
    value = a + b if op == "+" else a - b
    # A near miss (an off-by-one or carry-style error) is a plausible wrong answer.
    offsets = [d for d in (1, -1, 10, -10) if value + d >= 0]
    wrong = value + rng.choice(offsets)
    return Example(prompt=f"{a}{op}{b}=", answer=str(value), ground_truth=str(value), wrong=str(wrong))


def make_arithmetic(digits: int = 2, ops: str = "+") -> Task:
    """Addition (and optionally subtraction) of two `digits`-digit numbers; `ops` in {"+", "+-", "-"}.

    Scored by exact match: 1.0 when the stripped response equals the answer string.
    """
    # Imported on use: reinforge.rewards builds its registry from this package's TASKS.
    from reinforge.rewards.builtin import exact_match

    if not isinstance(digits, int) or not 1 <= digits <= 12:
        raise ValueError(f"arithmetic: digits must be an int in 1..12, got {digits!r}")
    if not ops or set(ops) - {"+", "-"}:
        raise ValueError(f"arithmetic: ops must be made of '+' and '-', got {ops!r}")
    ops = "".join(sorted(set(ops), key=ops.index))
    lo, hi = _operand_range(digits)
    n = hi - lo + 1
    # '+' gives n*n prompts; '-' gives n*(n+1)/2 (operands ordered so a >= b).
    size = (n * n if "+" in ops else 0) + (n * (n + 1) // 2 if "-" in ops else 0)
    return Task(
        name="arithmetic",
        ability="arithmetic",
        sample=functools.partial(_sample, digits=digits, ops=ops),
        score=exact_match,
        options={"digits": digits, "ops": ops},
        size=size,
    )
