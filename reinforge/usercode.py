"""User code named in a config: one loader and one syntax for reward functions, tools and
environments.

    path/to/file.py:name        # a .py file (relative to the working directory), imported once
    package.module:name         # an importable module

The old forms still load and print one `[reinforge] deprecated:` line each:
`python:path/to/file.py:name` / `python:package.module:name` (tools and environments) and
`package.module.name` (reward functions).

`python:<name>` (no second colon) has one meaning: an object handed over in Python, which exists
in this process only and is recorded under that name in config.yaml: reward functions given as
RLTrainer(reward_funcs=[fn]) (rewards/registry.py) and rows given as train_dataset / eval_dataset
(trainers/inputs.py, config/validate.py IN_MEMORY_PREFIX).

Errors are ConfigError (a ValueError) naming the kind ("reward", "tool", "environment") and the
spec. ConfigError is imported on failure only, so reward worker processes do not pay for the
config package.
"""
from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import os
import sys
from typing import Any, Callable

IN_PROCESS_PREFIX = "python:"
_warned: set[str] = set()


def _error(message: str) -> ValueError:
    from reinforge.config.load import ConfigError

    return ConfigError(message)


def is_in_process_name(spec: str) -> bool:
    """True for a `python:<name>` of an object handed over in Python (not user code)."""
    return spec.startswith(IN_PROCESS_PREFIX) and ":" not in spec[len(IN_PROCESS_PREFIX):]


def _deprecated(spec: str, kind: str, new: str) -> None:
    """One stderr line per old-form spec, in the main process only (reward worker processes
    load every spec again)."""
    if spec in _warned or multiprocessing.parent_process() is not None:
        return
    _warned.add(spec)
    print(f"[reinforge] deprecated: {kind} '{spec}': write '{new}' (docs/rewards.md, docs/agents.md)", file=sys.stderr)


def split_spec(spec: str, kind: str, *, dotted: bool = False) -> tuple[str, str]:
    """(target, attr) of a user-code spec: target a module name or a path ending in .py.

    dotted: also accept the deprecated `package.module.name` (reward functions' old form).
    """
    prefix = IN_PROCESS_PREFIX if spec.startswith(IN_PROCESS_PREFIX) else ""
    body = spec[len(prefix):]
    target, sep, attr = body.rpartition(":")
    if not sep and dotted and not prefix:
        target, _, attr = body.rpartition(".")
        if target and attr:
            _deprecated(spec, kind, f"{target}:{attr}")
    elif prefix and target and attr:
        _deprecated(spec, kind, body)
    if not target or not attr:
        raise _error(f"{kind} '{spec}': expected '{prefix}module:attr' or '{prefix}path/file.py:attr'")
    return target, attr


def import_target(target: str, kind: str, spec: str):
    """The module a spec's target names: a .py file (imported once per process) or a module."""
    if target.endswith(".py"):
        return import_file(target, kind)
    try:
        return importlib.import_module(target)
    except Exception as exc:  # ImportError, or the module's own code raised at import
        raise _error(f"{kind} '{spec}': cannot import module '{target}' "
                     f"(importing {target} raised {type(exc).__name__}: {exc})") from exc


def import_file(path: str, kind: str = "user code"):
    """Import a .py file once per process under a name derived from its absolute path."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise _error(f"{kind} file not found: {path}")
    name = "reinforge_user_" + str(abs(hash(path)))
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # lets dataclasses / pickling inside the file find the module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # a syntax error (its message holds the line) or the file's own code
        del sys.modules[name]
        raise _error(f"{kind} file {path}: {type(exc).__name__}: {exc}") from exc
    return module


def load_user_object(spec: str, kind: str, *, expect: str = "an object",
                     accept: Callable[[Any], bool] | None = None, dotted: bool = False) -> Any:
    """The object a user-code spec names (module docstring); ConfigError naming `kind` and the
    spec when it cannot be imported, is missing, or fails `accept` (`expect` says what it must be).
    """
    target, attr = split_spec(spec, kind, dotted=dotted)
    module = import_target(target, kind, spec)
    if not hasattr(module, attr):
        raise _error(f"{kind} '{spec}': {target} has no attribute '{attr}' (not {expect})")
    obj = getattr(module, attr)
    if accept is not None and not accept(obj):
        raise _error(f"{kind} '{spec}' is a {type(obj).__name__}; it must be {expect}")
    return obj
