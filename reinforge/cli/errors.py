"""Exceptions that mean "bad input": the CLI prints them as one line and exits with code 2.

Named as (module, class) and resolved only when an exception reaches the CLI, from the modules
already imported: an exception of a class can only be raised once its module is loaded, so the
CLI never imports torch or transformers just to be able to catch an error (`--help` stays fast).
"""
from __future__ import annotations

import sys

USER_ERROR_NAMES = (
    ("reinforge.config.load", "ConfigError"),
    ("reinforge.data.io", "DataError"),
    ("reinforge.models.checks", "ModelLoadError"),
    ("reinforge.rewards.manager", "RewardError"),
    ("reinforge.distributed.errors", "WorkerDiedError"),
    ("builtins", "FloatingPointError"),
    ("builtins", "FileNotFoundError"),
)


def user_errors() -> tuple[type[BaseException], ...]:
    """The classes of USER_ERROR_NAMES whose modules are loaded (the others cannot have been raised)."""
    found = (getattr(sys.modules.get(module), name, None) for module, name in USER_ERROR_NAMES)
    return tuple(cls for cls in found if isinstance(cls, type))


def is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, user_errors())
