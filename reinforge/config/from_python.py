"""Configs built in Python: `RLConfig.from_preset("grpo", **overrides)` and `RLConfig.from_dict(d)`
(RootConfig's class methods; SFT, DPO and RM configs have them too).

Python values become the same dotted overrides the command line gives, so they go through the
same key checks ("did you mean"), type coercion and errors: each value is written as YAML, which
the overrides' parser reads back to the value itself.
"""
from __future__ import annotations

import os
from typing import Any, TypeVar

import yaml

from reinforge.config.load import ConfigError, load_config

T = TypeVar("T")


def _flatten(values: dict, prefix: str = "") -> dict[str, Any]:
    """{"trainer": {"total_steps": 2}, "actor.lr": 1e-6} -> {"trainer.total_steps": 2, "actor.lr": 1e-6}
    (lists are values, not flattened; an empty dict stays a value)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise ConfigError(f"config key {prefix}{key!r}: keys are strings")
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _plain(value: Any, key: str) -> Any:
    """`value` with paths as strings, in lists and dicts too."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, key) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, key) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ConfigError(f"config key {key!r}: a {type(value).__name__} cannot be a config value "
                      "(give strings, numbers, booleans, None, lists or dicts of them)")


def as_overrides(values: dict) -> list[str]:
    """Nested or dotted Python values -> ["section.key=<YAML>", ...] for load_config."""
    out = []
    for key, value in _flatten(values).items():
        text = yaml.safe_dump(_plain(value, key), default_flow_style=True, width=float("inf"), allow_unicode=True)
        out.append(f"{key}={text.rstrip(chr(10)).removesuffix(chr(10) + '...')}")
    return out


def config_from(schema: type[T], preset: str | None, values: dict) -> T:
    """Defaults of `schema`, then `preset` (a preset name or YAML path), then `values`."""
    return load_config(schema, preset, as_overrides(values))
