"""Resolve a reward spec (a built-in name, user code as `path/to/file.py:fn` or `package.module:fn`
(reinforge.usercode), or python:<name> for a callable handed over in Python) to a callable."""

from __future__ import annotations

from typing import Callable

from reinforge.config.hints import did_you_mean
from reinforge.rewards.builtin import exact_match, format_reward, math_verify_reward
from reinforge.rewards.code_tests import code_tests
from reinforge.rewards.reasoning_gym import reasoning_gym_reward
from reinforge.tasks import TASKS
from reinforge.usercode import IN_PROCESS_PREFIX, is_in_process_name, load_user_object

# Each built-in task's own verifier, under the task's name.
TASK_REWARDS: dict[str, Callable] = {name: make().score for name, make in TASKS.items()}


def auto_reward(prompt: str, response: str, ground_truth, data_source: str | None = None, **extra) -> float:
    """Dispatch on `data_source` (RLDataset passes it in extra): built-in tasks use their own
    verifier, reasoning-gym rows (reasoning_gym/<task>) the task's scorer, GSM8K/MATH-like sources
    use math_verify, anything else exact match."""
    source = (data_source or "").lower()
    if source.startswith("reasoning_gym/"):
        return reasoning_gym_reward(prompt, response, ground_truth, **extra)["score"]
    if source in TASK_REWARDS:
        return TASK_REWARDS[source](prompt, response, ground_truth)
    if any(k in source for k in ("gsm8k", "math", "aime", "amc")):
        return math_verify_reward(prompt, response, ground_truth)
    return exact_match(prompt, response, ground_truth)


auto_reward.preload_modules = ("math_verify",)

BUILTIN_REWARDS: dict[str, Callable] = {
    "auto": auto_reward,
    "math_verify": math_verify_reward,
    "exact_match": exact_match,
    "format": format_reward,
    "code_tests": code_tests,
    "reasoning_gym": reasoning_gym_reward,
    **TASK_REWARDS,
}


def _spec_error(message: str) -> ValueError:
    """A bad reward spec is a config error (the CLI prints one line, exit 2). Imported here,
    on failure only, so reward worker processes do not pay for the config package."""
    from reinforge.config.load import ConfigError

    return ConfigError(message)


# Functions handed over in Python (RLTrainer(reward_funcs=[fn])), under "python:<name>" names
# that config.yaml can record; they exist in this process only.
PYTHON_PREFIX = IN_PROCESS_PREFIX
_PYTHON_REWARDS: dict[str, Callable] = {}


def register_python_reward(fn: Callable) -> str:
    """A "python:<name>" spec that load_reward_fn resolves to `fn` in this process (the same
    name again for the same function; <name>_2, ... for another function of the same name)."""
    base = PYTHON_PREFIX + getattr(fn, "__name__", type(fn).__name__)
    name, k = base, 1
    while _PYTHON_REWARDS.get(name, fn) is not fn:
        k += 1
        name = f"{base}_{k}"
    _PYTHON_REWARDS[name] = fn
    return name


def load_reward_fn(spec) -> Callable:
    """A reward function from `spec`.

    spec: a callable (returned as is); a built-in name (see BUILTIN_REWARDS); "path/to/file.py:fn";
    "package.module:fn"; or a "python:<name>" from register_python_reward. The old "pkg.mod.fn"
    and "python:file.py:fn" forms still load, with a deprecation line (reinforge.usercode). The
    function is written in one of the styles of reinforge.rewards.styles (reinforge, veRL, TRL).
    A bad spec raises ConfigError (a ValueError) naming it, with a did-you-mean for a mistyped built-in.
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise _spec_error(f"reward spec must be a name, 'module:fn' or 'file.py:fn', got {spec!r}")
    spec = spec.strip()
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if is_in_process_name(spec):
        if spec not in _PYTHON_REWARDS:
            raise _spec_error(f"reward '{spec}' was a Python function handed to RLTrainer(reward_funcs=...) in "
                              "another process; pass it again that way, or name it as 'file.py:fn' or 'module:fn'")
        return _PYTHON_REWARDS[spec]
    if spec.endswith(".py"):
        raise _spec_error(f"reward '{spec}': name the function in the file too, '{spec}:fn'")
    if ":" not in spec and "." not in spec.strip("."):
        hint = did_you_mean(spec, BUILTIN_REWARDS)
        raise _spec_error(
            f"unknown reward '{spec}'; {hint}built-ins: {', '.join(sorted(BUILTIN_REWARDS))}; "
            "or give 'package.module:fn' or 'path/to/file.py:fn'"
        )
    return load_user_object(spec, "reward", expect="a callable", accept=callable, dotted=True)


def check_reward_signature(fn: Callable, spec: str, style: str | None = None) -> None:
    """ConfigError unless `fn` can be called as its style calls it (reinforge.rewards.styles):
    the style `style` forces, or the one its parameter names say. Callables whose signature
    Python cannot read (C functions) pass."""
    from reinforge.rewards.styles import calling, signature_error

    try:
        c = calling(fn, style)
    except ValueError as exc:
        raise _spec_error(f"reward '{spec}': {exc}") from None
    error = signature_error(fn, c, forced=style not in (None, "auto"))
    if error:
        raise _spec_error(f"reward '{spec}': {error}")
