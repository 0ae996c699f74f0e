"""Checkpoints that survive crashes, and bit-exact resume.

`checkpoints/step_N/` holds each model's weights (safetensors), `trainer_state.pt` (optimizer,
scheduler, RNG states, data-loader position, KL controller, step) and the resolved config. It is
written to a hidden temporary folder and renamed only when complete, so a crash mid-save leaves
the previous checkpoint intact; only the last `keep_last` are kept.
"""
from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

STEP_RE = re.compile(r"^step_(\d+)$")


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first. Temporary folders of interrupted saves are ignored."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.match(p.name)) and (p / "COMPLETE").exists()]
    return sorted(found)


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1][1] if found else None


def save_checkpoint(ckpt_dir: str | os.PathLike, step: int, models: dict[str, torch.nn.Module],
                    state: dict[str, Any], config_yaml: str, keep_last: int = 2,
                    writers: tuple = ()) -> Path:
    """Write `step_<step>/` atomically and prune old checkpoints. Returns its path.

    `writers` are called with the temporary folder first (sharded state of a worker group
    goes there, and may add to `state`), so they are part of the same atomic rename."""
    root = Path(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for write in writers:
        write(tmp)
    for name, model in models.items():
        save_model(model, str(tmp / f"{name}.safetensors"))  # handles tied embeddings
    torch.save(state, tmp / "trainer_state.pt")
    (tmp / "config.yaml").write_text(config_yaml)
    (tmp / "COMPLETE").write_text(str(step))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in list_checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike, models: dict[str, torch.nn.Module]) -> dict[str, Any]:
    """Load weights into `models` in place and return the trainer state."""
    path = Path(path)
    if not (path / "COMPLETE").exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint")
    for name, model in models.items():
        f = path / f"{name}.safetensors"
        if not f.exists():
            raise FileNotFoundError(f"checkpoint {path} has no weights for {name!r}")
        missing, unexpected = load_model(model, str(f), strict=True)
    return torch.load(path / "trainer_state.pt", weights_only=False)


def export_hf(model, tokenizer, out_dir: str | os.PathLike) -> Path:
    """A folder `from_pretrained` loads: weights, config and tokenizer (LoRA merged first)."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    if hasattr(model, "merge_and_unload"):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def save_single_model_run(run_dir: Path, step: int, model, opt, sched, loader, cfg, keep_last: int) -> Path:
    """Checkpoint of a one-model trainer (SFT, DPO, RM): weights, optimizer, scheduler, RNG, loader."""
    import yaml

    state = {"step": step, "rng": rng_state(), "loader": loader.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict()}
    return save_checkpoint(Path(run_dir) / "checkpoints", step, {"model": model}, state,
                           yaml.safe_dump(cfg.to_dict(), sort_keys=False), keep_last)


def resume_single_model_run(run_dir: Path, path: str | None, model, opt, sched, loader) -> int | None:
    """Restore what `save_single_model_run` wrote (latest checkpoint unless `path`); returns its
    step, or None when there is no checkpoint."""
    ckpt = Path(path) if path else latest_checkpoint(Path(run_dir) / "checkpoints")
    if ckpt is None:
        return None
    state = load_checkpoint(ckpt, {"model": model})
    loader.load_state_dict(state["loader"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state["step"]
