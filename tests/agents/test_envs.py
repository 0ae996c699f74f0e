"""The guess_number environment, the env registry and user environments, and the task's verifier."""
from __future__ import annotations

import pytest

from reinforge.agents.base import Environment, EnvStep
from reinforge.agents.envs import ENVS, GuessNumber, load_env
from reinforge.config.load import ConfigError
from reinforge.tasks.guess_number import guesses, random_play, score_guess_number


def _row(secret: int, max_turns: int = 5) -> dict:
    return {"prompt": "#0001 1-31?", "reward_model": {"style": "rule", "ground_truth": str(secret)},
            "env": "guess_number", "env_kwargs": {"max_turns": max_turns}}


def test_higher_lower_correct_and_reward_on_success():
    env = ENVS["guess_number"]()
    assert env.reset(_row(20)) == ""
    assert env.step("16") == EnvStep("<r>higher</r>", 0.0, False, {"turns": 1})
    assert env.step("I say 24, then 1") == EnvStep("<r>lower</r>", 0.0, False, {"turns": 2})
    assert env.step("no number") == EnvStep("<r>?</r>", 0.0, False, {"turns": 3})
    assert env.step("20") == EnvStep("<r>correct</r>", 1.0, True, {"turns": 4})


def test_episode_ends_after_k_turns_without_reward():
    env = GuessNumber()
    env.reset(_row(7, max_turns=3))
    steps = [env.step(str(g)) for g in (1, 2, 3)]
    assert [s.done for s in steps] == [False, False, True] and all(s.reward == 0.0 for s in steps)
    env.reset({"ground_truth": "5"})  # plain ground_truth column; default max_turns 5
    assert [env.step("1").done for _ in range(5)] == [False] * 4 + [True]


def test_task_verifier_reads_each_turns_guess():
    full = "16<r>higher</r>24<r>lower</r>20<r>correct</r>"
    assert guesses(full) == [16, 24, 20] and score_guess_number("", full, "20") == 1.0
    assert score_guess_number("", "16<r>higher</r>x<r>?</r>", "20") == 0.0
    assert guesses("16<r>higher</r>x<r>?</r>") == [16, None]


def test_demonstrations_play_within_the_range_left():
    from reinforge.tasks.base import Example

    ex = Example("#0042 1-31?", "20", "20", "21")
    demo = random_play(ex, max_turns=5)
    assert demo == random_play(ex, max_turns=5)  # seeded by the prompt
    env, low, high = GuessNumber(), 1, 31
    env.reset(_row(20))
    turns = demo["completion"]
    for k in range(0, len(turns), 2):
        guess = int(turns[k]["content"].removesuffix("<eos>"))
        assert low <= guess <= high and turns[k]["content"].endswith("<eos>")
        step = env.step(turns[k]["content"])
        if k + 1 < len(turns):
            assert turns[k + 1] == {"role": "user", "content": step.observation}
            low, high = (guess + 1, high) if step.observation == "<r>higher</r>" else (low, guess - 1)
    assert len(turns) <= 2 * 5


class Echo(Environment):
    """A user environment: done after repeating the row's word."""

    def reset(self, row):
        self.word = row["word"]
        return f"say {self.word}"

    def step(self, action):
        return EnvStep(None, reward=float(action.strip() == self.word), done=True)


def test_load_user_environments(tmp_path):
    assert load_env("guess_number") is GuessNumber
    env = load_env("python:tests.agents.test_envs:Echo")()
    assert env.reset({"word": "hi"}) == "say hi" and env.step("hi").reward == 1.0
    f = tmp_path / "envs.py"
    f.write_text("def make():\n    from tests.agents.test_envs import Echo\n    return Echo()\nclass NotEnv:\n    pass\n")
    made = load_env(f"python:{f}:make")()
    assert isinstance(made, Environment) and type(made).__name__ == "Echo"
    for spec, message in [("guess_numbr", "did you mean 'guess_number'"),
                          (f"python:{f}:NotEnv", "not a reinforge.agents.base.Environment subclass"),
                          (f"python:{f}:nothing", "environment 'python:.*envs.py has no attribute 'nothing'")]:
        with pytest.raises(ConfigError, match=message):
            load_env(spec)
