"""The config keys that follow from the algorithm registries (reinforge.algos.registry): the keys
that name an entry (checked with the valid names and a did-you-mean, then the entry's own
rules on its params), and the section fields that are entries' hyper-parameters (their ranges
are the params' ranges: config/ranges.py asks `param_range`).

The sections keep one typed field per hyper-parameter (importing the config must not import
torch, which the registries' modules do): `check_section` (run on the selected entry by
`check_entries`, and on every entry by tests/algos/test_registry.py) makes the fields and the
params agree. The registries are imported when a check runs, not when this module is.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import fields
from typing import Any

from reinforge.config.hints import did_you_mean
from reinforge.config.load import ConfigError

# A section class (by name, as config/ranges.py keys its table) -> the registry whose params
# are its fields: (module of reinforge.algos, registry attribute).
PARAM_SECTIONS = {"ActorConfig": ("policy_loss", "POLICY_LOSSES"),
                  "AlgorithmConfig": ("advantages", "ADVANTAGE_ESTIMATORS")}


def registry(module: str, name: str):
    """reinforge.algos.<module>.<name> (imported on first use)."""
    return getattr(importlib.import_module(f"reinforge.algos.{module}"), name)


def section_registry(cls: type):
    """The registry whose params are fields of config section `cls` (or a subclass), else None."""
    for klass in cls.__mro__:
        if klass.__name__ in PARAM_SECTIONS:
            return registry(*PARAM_SECTIONS[klass.__name__])
    return None


def param_range(cls: type, name: str) -> str | None:
    """The interval of field `name` of section `cls` when it is a registry param, else None."""
    reg = section_registry(cls)
    f = reg.param_fields().get(name) if reg is not None else None
    return f.metadata["range"] if f is not None else None


def check_section(cls: type, entry, key: str) -> None:
    """Section `cls` has a field for each param of `entry`, with the param's default: the config
    key is the param (ConfigError naming the field to add or fix)."""
    have = {f.name: f for f in fields(cls)}
    for p in entry.param_fields():
        f = have.get(p.name)
        need = f"a field `{p.name}: {p.type} = {p.default!r}` ({p.metadata['doc']})"
        if f is None:
            raise ConfigError(f"{key}={entry.name!r} reads {p.name!r}, which {cls.__name__} lacks: add {need}")
        if f.default != p.default:
            raise ConfigError(f"{cls.__name__}.{p.name} defaults to {f.default!r}, {entry.name!r}'s param to "
                              f"{p.default!r}: make them one, {need}")


def _check_name(value: str, reg, key: str) -> None:
    if value not in reg:
        close = did_you_mean(value, reg, f"{key}=")
        hint = f"; {close.strip()}" if close else ""
        raise ConfigError(f"{key}={value!r} is not known; valid: {sorted(reg)}{hint}")


def _dotted(msg: str, names, prefix: str) -> str:
    """An entry's message names its params as `name=value`; the config shows dotted keys."""
    for n in names:
        msg = re.sub(rf"(?<![\w.]){re.escape(n)}=", f"{prefix}.{n}=", msg)
    return msg


def check_entry(value: str, reg, key: str, section: Any = None) -> None:
    """`value` (config key `key`) names an entry of `reg`. With the `section` that holds the
    registry's params: the entry's params are fields there, and every entry's own rules (such
    as clip_cov's window) hold, as a range holds whichever entry is selected."""
    _check_name(value, reg, key)
    if section is None:
        return
    check_section(type(section), reg.entry(value), key)
    prefix, have = key.rsplit(".", 1)[0], {f.name for f in fields(section)}
    for entry in reg.entries():
        names = [f.name for f in entry.param_fields()]
        if entry.validate is None or not set(names) <= have:
            continue
        try:
            entry.make_params(section)
        except ValueError as exc:
            raise ConfigError(_dotted(str(exc), names, prefix)) from None


def check_entries(cfg) -> None:
    """Every key of an RL config that names a registry entry."""
    a, act = cfg.algorithm, cfg.actor
    check_entry(a.adv_estimator, registry("advantages", "ADVANTAGE_ESTIMATORS"), "algorithm.adv_estimator", a)
    check_entry(act.policy_loss, registry("policy_loss", "POLICY_LOSSES"), "actor.policy_loss", act)
    modes, kls = registry("aggregation", "AGG_MODES"), registry("kl", "KL_ESTIMATORS")
    check_entry(act.loss_agg_mode, modes, "actor.loss_agg_mode")
    check_entry(cfg.critic.loss_agg_mode, modes, "critic.loss_agg_mode")
    check_entry(act.kl_loss_type, kls, "actor.kl_loss_type")
    check_entry(a.kl_penalty, kls, "algorithm.kl_penalty")


# How the docs table names the advantage estimators' traits.
_NEEDS = {"needs_values": "critic", "needs_groups": "groups (rollout.n >= 2)", "needs_baseline": "greedy baseline",
          "needs_token_stats": "old-log-prob pass with sum pi^2"}
_MARK = re.compile(r"(<!-- registry:(\w+) -->)\n.*?(<!-- /registry:\2 -->)", re.S)


def docs_tables() -> dict[str, str]:
    """The Markdown tables docs/algorithms.md shows, by block name."""
    from reinforge.algos.registry import markdown_table, params_table

    losses, advs = registry("policy_loss", "POLICY_LOSSES"), registry("advantages", "ADVANTAGE_ESTIMATORS")
    return {"policy_losses": markdown_table(losses), "policy_loss_params": params_table(losses, "actor"),
            "advantage_estimators": markdown_table(advs, _NEEDS), "advantage_params": params_table(advs, "algorithm"),
            "kl_estimators": markdown_table(registry("kl", "KL_ESTIMATORS")),
            "aggregation_modes": markdown_table(registry("aggregation", "AGG_MODES"))}


def render_docs(text: str) -> str:
    """`text` with each `<!-- registry:NAME -->` ... `<!-- /registry:NAME -->` block refilled."""
    tables = docs_tables()
    return _MARK.sub(lambda m: f"{m.group(1)}\n{tables[m.group(2)]}\n{m.group(3)}", text)


if __name__ == "__main__":  # python -m reinforge.config.registries docs/algorithms.md
    import sys
    from pathlib import Path

    for path in map(Path, sys.argv[1:]):
        path.write_text(render_docs(path.read_text(encoding="utf-8")), encoding="utf-8")
