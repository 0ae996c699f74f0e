"""Built-in environments (reinforge.agents.base.Environment) and the registry the loop reads.

    ENVS["guess_number"]     # higher/lower number guessing, the `guess_number` task's game
    load_env("my_envs.py:Maze")   # a user Environment subclass (or a no-argument factory)
"""
from __future__ import annotations

import re
from typing import Callable

from reinforge.agents.base import Environment, EnvStep
from reinforge.config.hints import did_you_mean
from reinforge.config.load import ConfigError
from reinforge.tasks.tags import format_tag_result
from reinforge.usercode import load_user_object

_INT = re.compile(r"-?\d+")


def row_ground_truth(row: dict):
    """The ground truth of a dataset row: veRL's reward_model.ground_truth, else ground_truth."""
    reward_model = row.get("reward_model")
    if isinstance(reward_model, dict) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    return row.get("ground_truth")


class GuessNumber(Environment):
    """Guess a secret integer in at most `max_turns` guesses (the prompt states the range).

    The secret is the row's ground truth; max_turns comes from the row's `env_kwargs` column
    (default 5). Each action's first integer is the guess; the observation
    is `<r>higher</r>`, `<r>lower</r>` or `<r>correct</r>` (`<r>?</r>` when the action holds no
    integer, which still spends a turn). The turn that guesses right has reward 1.0 and ends
    the episode; running out of turns ends it with reward 0.
    """

    def reset(self, row: dict) -> str:
        kwargs = row.get("env_kwargs") or {}
        self.secret = int(row_ground_truth(row))
        self.max_turns = int(kwargs.get("max_turns", 5))
        self.turns = 0
        return ""

    def step(self, action: str) -> EnvStep:
        self.turns += 1
        found = _INT.search(action)
        guess = int(found.group()) if found else None
        if guess == self.secret:
            return EnvStep(format_tag_result("correct"), reward=1.0, done=True, info={"turns": self.turns})
        word = "?" if guess is None else ("higher" if guess < self.secret else "lower")
        done = self.turns >= self.max_turns
        return EnvStep(format_tag_result(word), reward=0.0, done=done, info={"turns": self.turns})


ENVS: dict[str, Callable[[], Environment]] = {"guess_number": GuessNumber}


def load_env(spec: str) -> Callable[[], Environment]:
    """A no-argument factory of Environments from a built-in name or a user-code spec
    (`file.py:attr`, `module:attr`) naming an Environment subclass or a factory function.
    ConfigError names the spec and what is valid."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"environment spec must be a name or 'module:attr', got {spec!r}")
    if spec in ENVS:
        return ENVS[spec]
    if ":" not in spec:
        raise ConfigError(f"unknown environment '{spec}'; {did_you_mean(spec, ENVS)}built-ins: "
                          f"{', '.join(sorted(ENVS))}; or 'package.module:attr' / 'path/to/file.py:attr'")
    obj = load_user_object(spec, "environment", expect="an Environment class or factory", accept=callable)
    if isinstance(obj, type) and not issubclass(obj, Environment):
        raise ConfigError(f"environment '{spec}': {obj.__name__} is not a reinforge.agents.base.Environment subclass")
    return obj
