"""User code named in a config: one loader and one syntax for reward functions, tools and
environments.

    path/to/file.py:name        # a .py file (relative to the working directory), imported once
    package.module:name         # an importable module (the working directory is searched too)

A file imports modules beside it as a script would (`from my_helpers import f`): while it runs,
its folder, then the working directory, lead sys.path; afterwards both stay at the end of
sys.path only (imports inside its functions still find them, and they shadow nothing installed).
A module beside the file that the file imports but that is already loaded from elsewhere (a
second user folder's helpers.py, an installed or standard module of that name) is a ConfigError
naming both, not a silent use of the other one.

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

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import multiprocessing
import os
import sys
from typing import Any, Callable, Iterator

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
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as exc:
            # The console script's sys.path lacks the working directory (`python -m` has it):
            # look there too, only for a module found nowhere else.
            cwd = os.getcwd()
            if not exc.name or target.split(".")[0] != exc.name.split(".")[0] or _on_path(cwd):
                raise
            with _leading_paths([cwd]):
                return importlib.import_module(target)
    except Exception as exc:  # ImportError, or the module's own code raised at import
        raise _error(f"{kind} '{spec}': cannot import module '{target}' "
                     f"(importing {target} raised {type(exc).__name__}: {exc})") from exc


def _on_path(folder: str) -> bool:
    return any(os.path.abspath(p or os.curdir) == folder for p in sys.path)


@contextlib.contextmanager
def _leading_paths(folders: list[str]) -> Iterator[None]:
    """`folders` first on sys.path while the block runs; afterwards each one that was not on
    sys.path before is at its end (later imports of a name nothing installed has, such as one
    inside a user function, still find it there; it shadows nothing)."""
    before = [f for f in folders if _on_path(f)]
    sys.path[:0] = folders
    try:
        yield
    finally:
        for f in folders:  # one copy each; a copy the user code added itself stays
            if f in sys.path:
                sys.path.remove(f)
        sys.path.extend(f for f in folders if f not in before and not _on_path(f))


def _provides(folder: str, name: str) -> str | None:
    """The file or package folder by which `folder` provides top-level module `name`, if any
    (a plain folder without __init__.py is a namespace package, which anything else outranks)."""
    for candidate in (os.path.join(folder, name + ".py"), os.path.join(folder, name, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _loaded_from(module) -> str:
    where = getattr(module, "__file__", None)
    if where:
        return os.path.realpath(where)
    portions = list(getattr(module, "__path__", None) or ())
    return f"the namespace package {portions}" if portions else "(built into Python)"


def _imported_names(path: str) -> set[str]:
    """The top-level module names a file's import statements name (anywhere in it); empty when
    it does not parse (exec_module then reports the syntax error)."""
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read(), path)
    except (SyntaxError, ValueError, OSError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _check_clashes(path: str, kind: str) -> None:
    """ConfigError when the file imports a module beside it that sys.modules already has from
    elsewhere (Python would reuse that one). The working directory is not checked: there, as
    under `python -m`, a module already loaded wins (a checkout of an installed package, say)."""
    folder = os.path.dirname(path)
    for name in sorted(_imported_names(path)):
        beside = _provides(folder, name)
        loaded = sys.modules.get(name)
        if beside is None or loaded is None:
            continue
        where = _loaded_from(loaded)
        if where != os.path.realpath(beside):
            raise _error(f"{kind} file {path} imports '{name}', which is {beside}, but a module '{name}' is already "
                         f"loaded from {where}; rename {beside} (module names are one namespace per process)")


def import_file(path: str, kind: str = "user code"):
    """Import a .py file once per process under a name derived from its absolute path, with its
    folder and the working directory leading sys.path while it runs (module docstring)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise _error(f"{kind} file not found: {path}")
    # Stable across processes (hash() of a str is not), so a worker's module has the parent's name.
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    name = f"reinforge_user_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    folders = list(dict.fromkeys([os.path.dirname(path), os.getcwd()]))
    _check_clashes(path, kind)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # lets dataclasses / pickling inside the file find the module
    try:
        with _leading_paths(folders):
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
