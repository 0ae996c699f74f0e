"""`guess_number`: find a secret number in 1..high with higher/lower feedback, in at most
`max_turns` guesses (issue 13's multi-turn environment task; reinforge.agents.envs.GuessNumber).

    prompt   "#0421 1-31?"          (a game number, so that prompts are distinct, and the range)
    turn     "16<eos>"              one guess per turn, ended by EOS
    answer   "<r>higher</r>"        the environment's observation (no loss), then the next turn

RL rows carry `env: "guess_number"` and `env_kwargs: {"max_turns": k}`; the ground truth is the
secret. SFT rows demonstrate a valid but slow strategy, a uniformly random guess among the
numbers the feedback so far still allows, so that RL has room to find bisection (at most
ceil(log2(high + 1)) turns: 5 for 1..31).
"""
from __future__ import annotations

import functools
import random
import re

from reinforge.tasks.base import Example, Task
from reinforge.tasks.tags import TAG_RESULT_CLOSE, TAG_RESULT_OPEN, format_tag_result

_OBSERVATION = re.compile(re.escape(TAG_RESULT_OPEN) + ".*?" + re.escape(TAG_RESULT_CLOSE), re.S)
_INT = re.compile(r"-?\d+")


def guesses(response: str) -> list[int | None]:
    """Each turn's guess (its first integer, None for a turn without one), turns being the text
    between observations."""
    turns = _OBSERVATION.split(response)
    if turns and not turns[-1].strip():
        turns = turns[:-1]  # the text after the last observation, when the episode ended there
    return [int(m.group()) if (m := _INT.search(t)) else None for t in turns]


def score_guess_number(prompt: str, response: str, ground_truth, **extra) -> float:
    """1.0 when some turn guessed the secret (the environment stops the episode at the first
    right guess or after max_turns, so reaching the text is succeeding in time)."""
    return 1.0 if isinstance(response, str) and int(ground_truth) in guesses(response) else 0.0


score_guess_number.bounded = True


def _sample(rng: random.Random, high: int) -> Example:
    secret = rng.randint(1, high)
    wrong = secret % high + 1
    return Example(prompt=f"#{rng.randrange(10_000):04d} 1-{high}?", answer=str(secret), ground_truth=str(secret),
                   wrong=str(wrong))


def _range(prompt: str) -> tuple[int, int]:
    low, high = prompt.split()[-1].rstrip("?").split("-")
    return int(low), int(high)


def random_play(example: Example, max_turns: int) -> dict:
    """SFT columns: one episode of uniform guessing within the still-possible range, as a
    conversational prompt/completion (turns end with EOS; the environment's observations are user messages:
    context). Seeded by the prompt, so the same example gives the same episode."""
    from reinforge.tasks.tokenizer import EOS

    rng = random.Random(f"guess_number:{example.prompt}")
    low, high = _range(example.prompt)
    secret = int(example.ground_truth)
    completion = []
    for _ in range(max_turns):
        guess = rng.randint(low, high)
        completion.append({"role": "assistant", "content": f"{guess}{EOS}"})
        if guess == secret:
            break
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
        completion.append({"role": "user", "content": format_tag_result("higher" if guess < secret else "lower")})
    return {"prompt": [{"role": "user", "content": example.prompt}], "completion": completion}


def make_guess_number(high: int = 31, max_turns: int = 5) -> Task:
    """Guess a number in 1..`high` in at most `max_turns` turns (10,000 distinct game numbers)."""
    if not isinstance(high, int) or not 2 <= high <= 9999:
        raise ValueError(f"guess_number: high must be an int in 2..9999, got {high!r}")
    if not isinstance(max_turns, int) or not 1 <= max_turns <= 50:
        raise ValueError(f"guess_number: max_turns must be an int in 1..50, got {max_turns!r}")
    return Task(name="guess_number", ability="multi_turn", sample=functools.partial(_sample, high=high),
                score=score_guess_number, options={"high": high, "max_turns": max_turns}, size=10_000,
                row_columns={"env": "guess_number", "env_kwargs": {"max_turns": max_turns}},
                sft_row=functools.partial(random_play, max_turns=max_turns))
