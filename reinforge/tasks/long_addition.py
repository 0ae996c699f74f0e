"""`long_addition`: "347+585=" -> "7+5=12 c1;4+8+1=13 c1;3+5+1=9 c0;=932", worked column by column.

A task whose responses are long (about 11 characters a column: 36-70 tokens for 3-6 digits with
the character tokenizer) and have position structure (each column depends on the previous
column's carry), so length biases and per-token credit assignment have something to act on; the
2-4-token answers of `arithmetic` have neither.

Response grammar, one step per column from the least significant digit:

    "{a}+{b}[+1]={s} c{carry};"   "+1" only when the previous column carried
    ...then "={answer}"           the answer follows the last "="

Only the final answer is scored: the text after the last "=" must equal the sum (1.0, else 0.0),
so a response with wrong steps and a right answer scores 1.0, and a truncated one (no final
"=answer" segment) scores 0.0 unless it was cut exactly after a correct final answer.
"""

from __future__ import annotations

import functools
import random

from reinforge.tasks.base import Example, Task

MAX_RESPONSE_CHARS = 4096  # a worked 12-digit sum is ~140 characters; a far longer reply is wrong


def worked_sum(a: int, b: int, digits: int, drop_carry_at: int | None = None) -> tuple[str, int]:
    """The column-by-column working of a + b over `digits` columns, and the sum it arrives at.

    With `drop_carry_at=k` the carry into column k (0 = units) is forgotten, the classic slip:
    the working stays well formed and ends in a wrong sum (when that column had a carry in).
    """
    steps, carry, total = [], 0, 0
    for k in range(digits):
        da, db = a // 10**k % 10, b // 10**k % 10
        carry_in = 0 if k == drop_carry_at else carry
        s = da + db + carry_in
        carry = s // 10
        total += s % 10 * 10**k
        steps.append(f"{da}+{db}{'+1' if carry_in else ''}={s} c{carry};")
    total += carry * 10**digits
    return "".join(steps) + f"={total}", total


def final_answer(response: str) -> str | None:
    """The text after the last "=", stripped; None when there is no "=" at all."""
    if not isinstance(response, str) or "=" not in response:
        return None
    return response[-MAX_RESPONSE_CHARS:].rsplit("=", 1)[1].strip()


def score_long_addition(prompt: str, response: str, ground_truth, **extra) -> float:
    """1.0 when the text after the response's last "=" equals the ground-truth sum, else 0.0."""
    return 1.0 if final_answer(response) == str(ground_truth).strip() else 0.0


score_long_addition.bounded = True  # one rsplit over at most MAX_RESPONSE_CHARS: linear time


def _sample(rng: random.Random, digits: int) -> Example:
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    answer, value = worked_sum(a, b, digits)
    # The rejected side of a preference pair: the same working with one carry forgotten, or
    # (no carry anywhere) the right working with a final answer off by one.
    carried = [k for k in range(1, digits) if (a % 10**k + b % 10**k) >= 10**k]
    if carried:
        wrong, _ = worked_sum(a, b, digits, drop_carry_at=rng.choice(carried))
    else:
        wrong = answer.rsplit("=", 1)[0] + f"={value + rng.choice((1, -1))}"
    return Example(prompt=f"{a}+{b}=", answer=answer, ground_truth=str(value), wrong=wrong)


def make_long_addition(digits: int = 3) -> Task:
    """Addition of two `digits`-digit numbers (2..12), answered with the column-by-column working.

    Scored on the final answer only (score_long_addition).
    """
    if not isinstance(digits, int) or not 2 <= digits <= 12:
        raise ValueError(f"long_addition: digits must be an int in 2..12, got {digits!r}")
    n = 9 * 10 ** (digits - 1)
    return Task(
        name="long_addition",
        ability="arithmetic",
        sample=functools.partial(_sample, digits=digits),
        score=score_long_addition,
        options={"digits": digits},
        size=n * n,
    )
