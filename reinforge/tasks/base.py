"""What a built-in task is: a seeded generator of examples plus a verifier."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Example:
    """One generated problem.

    `answer` is a response the verifier scores 1.0; `wrong` is a plausible response it scores
    0.0 (never equal to `answer`), used as the rejected side of preference pairs.
    `images` (a visual task's) are PNG bytes, one per image the prompt shows, in order; the rows
    then carry them in veRL's `images` column and `<image>` placeholders (tasks.make_task_data).
    """

    prompt: str
    answer: str
    ground_truth: str
    wrong: str
    images: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Task:
    """A built-in task: `sample(rng)` draws an `Example`; `score` is its reward function.

    `score(prompt, response, ground_truth, **extra) -> float` follows the reward-function API
    of `reinforge.rewards`, and is a module-level function so it pickles into reward workers.
    `reinforge.rewards` registers it under the task's name (for the default options) and
    `auto` dispatches to it on `data_source == name`, so it must not depend on the options.
    `size` is the number of distinct prompts when it is small enough to matter, else None.
    `row_columns` are extra top-level columns of every RL row (an agent task's `tools` or
    `env`); `sft_row(example)`, when set, gives an SFT row's text columns in place of
    {"prompt", "response": answer} (e.g. messages with a tool call and its result).
    """

    name: str
    ability: str
    sample: Callable[[random.Random], Example]
    score: Callable[..., float]
    options: dict[str, Any]
    size: int | None = None
    row_columns: dict[str, Any] = field(default_factory=dict)
    sft_row: Callable[[Example], dict] | None = None
