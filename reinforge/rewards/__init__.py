"""Reward functions and the manager that runs them.

A reward function is written in reinforge's style, fn(prompt, response, ground_truth, **extra)
-> float | dict (a dict has "score"; its other numeric keys are logged as reward/<fn>/<key>), or
batched with `fn.batched = True`, (prompts, responses, ground_truths, extras) -> list; in veRL's
(compute_score(data_source, solution_str, ground_truth, extra_info=None)) or in TRL's
(fn(prompts, completions, **kwargs) -> list[float | None]); sync or `async def`. The style is
read from the signature (reinforge.rewards.styles; docs/rewards.md).
An optional `fn.preload_modules = ("heavy_module",)` makes reward worker processes import
those modules at start-up, so a slow import is not charged to the first call's timeout;
`fn.warm_up()`, if set, is called there too (e.g. math_verify's first parse).
Every per-sample call has a timeout (`reward.timeout_s`): with `reward.num_workers=0` a
function runs in one worker process that is killed when a call overruns, unless it is marked
`fn.bounded = True` (it caps its own time, like the built-in verifiers) and runs in-process
(RewardManager says where each kind of function runs).
"""

from reinforge.rewards.builtin import exact_match, format_reward, math_verify_reward, soft_overlong_punishment
from reinforge.rewards.manager import RewardError, RewardManager
from reinforge.rewards.registry import BUILTIN_REWARDS, load_reward_fn

__all__ = [
    "BUILTIN_REWARDS", "load_reward_fn", "RewardManager", "RewardError", "RewardModelScorer",
    "exact_match", "format_reward", "math_verify_reward", "soft_overlong_punishment",
]


def __getattr__(name):
    # The scorer imports torch; keep `import reinforge.rewards` light for reward worker processes.
    if name == "RewardModelScorer":
        from reinforge.rewards.reward_model import RewardModelScorer

        return RewardModelScorer
    raise AttributeError(name)
