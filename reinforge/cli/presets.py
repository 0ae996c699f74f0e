"""`reinforge presets` (each preset, its command and one line) and `reinforge config` (the resolved
config a training command would run with, as YAML)."""
from __future__ import annotations

import shlex

from reinforge.config.load import (ConfigError, config_command, list_presets, load_config, resolve_config_path,
                                   yaml_header)


def cmd_presets(args) -> int:
    """One line per preset: name, the command it is for, and its description (the YAML's first line)."""
    rows = [(name, *yaml_header(resolve_config_path(name))) for name in list_presets()]
    width = max(len(name) for name, _, _ in rows)
    for name, command, text in rows:
        print(f"{name:<{width}}  {command or '?':<5}  {text}")
    return 0


def command_for(config: str | None, asked: str | None) -> str:
    """The training command a config is for: `asked` (--command), else the preset's header (or
    its base's), else train. A preset of another command is refused with the right one named."""
    found = config_command(config) if config else None
    if asked and found and asked != found:
        raise ConfigError(f"--config {config!r} is a `reinforge {found}` config, not `reinforge {asked}`: "
                          f"run reinforge {found} --config {config} ...")
    return asked or found or "train"


def resolved_config(command: str, config: str | None, overrides: list[str], check: bool = True):
    """The config of `command` from the preset/file and overrides; with `check`, the plan the
    config's own rules (ranges, names, sizes, files named exist) give (trainers/plan.py), whose
    to_dict() adds the derived values under `derived:`. A rule's error says how to see the
    config without them."""
    from reinforge.cli.main import TRAINERS, _load

    from reinforge.trainers.plan import plan_rl, plan_supervised

    cfg = load_config(_load(TRAINERS[command][0]), config, overrides)
    if not check:
        return cfg
    rules = plan_rl if command == "train" else plan_supervised
    try:
        return rules(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (reinforge config --no-validate prints the config without its checks)") from None


def cmd_config(args) -> int:
    """Print the resolved config as YAML; its first line names the command, so the output works
    as `--config file.yaml` (reinforge presets reads the same header)."""
    import yaml

    from reinforge.cli.main import TRAINERS

    command = command_for(args.config, args.command)
    config = args.config or TRAINERS[command][2]
    cfg = resolved_config(command, config, list(args.overrides), check=not args.no_validate)
    line = shlex.join(["reinforge", "config", *(["--config", config] if config else []), *args.overrides])
    print(f"# {command}: resolved by {line}")
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0
