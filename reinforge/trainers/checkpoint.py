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
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from reinforge.config.load import ConfigError, save_config

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
                    state: dict[str, Any], cfg, keep_last: int = 2, writers: tuple = ()) -> Path:
    """Write `step_<step>/` (with the resolved `cfg` as config.yaml) atomically and prune old
    checkpoints. Returns its path.

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
    save_config(cfg, tmp / "config.yaml")
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
        load_model(model, str(f), strict=True)
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


def no_checkpoint(ckpt_dir: Path) -> int:
    """What resume does when there is nothing to resume from: say so, and start at step 0."""
    print(f"[reinforge] no checkpoint in {ckpt_dir}; starting from step 0", file=sys.stderr)
    return 0


class SingleModelCheckpoints:
    """save() / resume() of a one-model trainer (SFT, DPO, RM): weights, optimizer, scheduler,
    RNG and loader position. The trainer has run_dir, step_idx, model, opt, sched, loader, cfg."""

    def save(self) -> Path:
        state = {"step": self.step_idx, "rng": rng_state(), "loader": self.loader.state_dict(),
                 "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()}
        return save_checkpoint(self.run_dir / "checkpoints", self.step_idx, {"model": self.model}, state, self.cfg,
                               self.cfg.trainer.keep_last)

    def resume(self, path: str | None = None) -> int:
        """Load the latest (or given) checkpoint; returns its step (0 when none exists)."""
        ckpt = Path(path) if path else latest_checkpoint(self.run_dir / "checkpoints")
        if ckpt is None:
            return no_checkpoint(self.run_dir / "checkpoints")
        state = load_checkpoint(ckpt, {"model": self.model})
        self.loader.load_state_dict(state["loader"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.step_idx = state["step"]
        return self.step_idx


def lock_run_dir(run_dir: Path):
    """Hold an exclusive lock on run_dir/.lock: two runs writing one run directory would
    interleave metrics.jsonl and race on checkpoints. The OS drops the lock if the process dies."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    f = open(run_dir / ".lock", "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise ConfigError(f"trainer.run_dir={str(run_dir)!r} is in use by another running process") from None
    return f


def claim_run_dir(run_dir: Path, cfg):
    """Lock `run_dir` (lock_run_dir) and write the resolved config to run_dir/config.yaml, as
    every trainer's fit() does first. Returns the lock file: `with claim_run_dir(...):` holds
    the lock until the block ends."""
    lock = lock_run_dir(run_dir)
    try:
        save_config(cfg, run_dir / "config.yaml")
    except BaseException:
        lock.close()
        raise
    return lock
