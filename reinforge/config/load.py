"""Load a config: dataclass defaults <- preset/YAML file(s) <- dotted command-line overrides.

Unknown keys fail with a "did you mean", wrong types fail naming the key (OmegaConf does the
coercion), and the result is a plain dataclass instance. A YAML file may name another preset
or file under `base:` to start from.
"""
from __future__ import annotations

import os
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, Sequence, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from reinforge.config.hints import did_you_mean

PRESET_DIR = Path(__file__).parent / "presets"
T = TypeVar("T")


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key(s) and the rule."""


# Keys that moved: the old name fails with the new one named (no silent alias, so a config
# never holds both). One name per concept in every command: the step budget is trainer.*.
RENAMED = {"optim.total_steps": "trainer.total_steps", "optim.epochs": "trainer.epochs"}


TRAINING_COMMANDS = ("train", "sft", "dpo", "rm")
DERIVED_KEY = "derived"  # the section of a written config that holds its plan's values (not read back)


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def yaml_header(path: Path) -> tuple[str | None, str]:
    """(command, description) from a config file's first line, `# <command>: <description>`
    (each preset has one; `reinforge presets` lists them). (None, "") for a file without it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline().strip()
    command, _, text = first.lstrip("#").strip().partition(":")
    if not first.startswith("#") or command not in TRAINING_COMMANDS:
        return None, ""
    return command, text.strip()


def config_command(name_or_path: str, seen: tuple = ()) -> str | None:
    """The command a preset or YAML file is for: its header's, else its `base:`'s, else None."""
    path = resolve_config_path(name_or_path)
    command, _ = yaml_header(path)
    if command or path in seen:
        return command
    try:
        base = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("base")
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
        return None  # load_config reports the file's own error
    return config_command(str(base), seen + (path,)) if base else None


def resolve_config_path(name_or_path: str) -> Path:
    """A preset name (`grpo`) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    preset = PRESET_DIR / f"{name_or_path}.yaml"
    if preset.exists():
        return preset
    if p.suffix in (".yaml", ".yml"):
        raise ConfigError(f"config file {name_or_path!r} does not exist")
    hint = did_you_mean(name_or_path, list_presets())
    raise ConfigError(f"config {name_or_path!r} is neither a YAML file nor a preset; {hint}presets: {list_presets()}")


def yaml_error(source: str, exc: yaml.YAMLError) -> ConfigError:
    """One line for a YAML syntax error: "<source>: line L, column C: <problem>" (1-based)."""
    def at(mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark, context, cmark = (getattr(exc, k, None) for k in ("problem_mark", "context", "context_mark"))
    where = f": {at(mark)}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if context:
        problem += f" ({context}" + (f" at {at(cmark)})" if cmark is not None else ")")
    return ConfigError(f"{source}{where}: YAML syntax error: {problem}")


def _read_yaml(path: Path, seen: tuple = ()) -> dict:
    if path in seen:
        raise ConfigError(f"circular 'base:' chain through {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise yaml_error(str(path), exc) from None
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start:exc.end]
        raise ConfigError(f"{path}: not UTF-8 text (byte {bad!r} at offset {exc.start}); save it as UTF-8") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    base = data.pop("base", None)
    if base is None:
        return data
    try:
        base_path = resolve_config_path(str(base))
    except ConfigError as exc:
        raise ConfigError(f"{path}: base: {exc}") from None
    parent = _read_yaml(base_path, seen + (path,))
    return _deep_merge(parent, data)


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _check_keys(schema, data: dict, prefix: str = "") -> None:
    """Every key in `data` must be a field of `schema` (recursively); suggest the closest."""
    valid = {f.name: f for f in fields(schema)}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if dotted in RENAMED:
            raise ConfigError(f"config key {dotted!r} is now {RENAMED[dotted]!r} (the same name in every "
                              f"command); write {RENAMED[dotted]}={value}")
        if key not in valid:
            close = did_you_mean(key, valid, prefix)
            hint = f"; {close.strip()}" if close else f"; valid keys: {sorted(valid)}"
            raise ConfigError(f"unknown config key {dotted!r}{hint}")
        ftype = valid[key].default_factory if valid[key].default_factory is not MISSING else None  # type: ignore[misc]
        sub = ftype() if callable(ftype) else None
        if isinstance(sub, list) and not isinstance(value, list):
            raise ConfigError(f"config key {dotted!r} is a list; give [{value}], not {value!r}")
        if is_dataclass(sub):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {dotted!r} is a section; give it a mapping, not {value!r}")
            _check_keys(type(sub), value, dotted + ".")


def parse_overrides(overrides: Sequence[str]) -> dict:
    """`["rollout.n=8", "actor.lr=1e-5"]` -> nested dict with YAML-typed values."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r}: {key.strip()!r} is not a dotted key like section.key")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise yaml_error(f"override {item!r}", exc) from None
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def load_config(schema: type[T], config: str | None = None, overrides: Sequence[str] = ()) -> T:
    """Defaults of `schema`, then the YAML `config` (preset name or path), then overrides."""
    data: dict = {}
    if config:
        data = _read_yaml(resolve_config_path(config))
        # A run's config.yaml (and `reinforge config`) records the plan derived from the config
        # under `derived:` (trainers/plan.py); it is an output, read back as nothing.
        data.pop(DERIVED_KEY, None)
    data = _deep_merge(data, parse_overrides(overrides))
    _check_keys(schema, data)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.create(data))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or ""
        raise ConfigError(f"config key {key!r}: {str(e).splitlines()[0]}") from None


def save_config(cfg: Any, path: str | os.PathLike) -> None:
    """Write a config dataclass, or the dict of a trainer's plan (trainers/plan.py `to_dict`: the
    resolved config and, under `derived:`, the values derived from it), as YAML: what the run
    actually used."""
    from dataclasses import asdict

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(cfg if isinstance(cfg, dict) else asdict(cfg), sort_keys=False))
