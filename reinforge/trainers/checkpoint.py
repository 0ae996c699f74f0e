"""Checkpoints that survive crashes, and bit-exact resume.

`checkpoints/step_N/` holds each model's weights (safetensors), `trainer_state.pt` (optimizer,
scheduler, RNG states, data-loader position, KL controller, step: the RL trainer's is a
trainers/state.TrainerState), the resolved config and `COMPLETE`, a manifest of every file's
size. A SIGKILL or power loss at any point leaves every
folder named `step_N` loadable:

- a save writes `.tmp_step_N_<pid>/`, fsyncs its files, writes the manifest, fsyncs the folder,
  and renames it to `step_N`;
- a folder is never deleted under its own name: it is renamed to `.trash_<name>_<pid>` first
  (out of the complete set), and an existing `step_N` is renamed away only once its
  replacement is complete; the HF export (`hf/`) is replaced the same way;
- `latest_checkpoint` picks the newest folder whose files match its manifest;
- `clean_leftovers`, run when a trainer claims its run directory, deletes the temporaries and
  trash of interrupted saves and puts back an export whose replacement was cut short.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from reinforge.config.load import ConfigError, save_config
from reinforge.models.lora import save_merged

STEP_RE = re.compile(r"^step_(\d+)$")
# `.tmp_<name>_<pid>` (being written) and `.trash_<name>_<pid>` (being deleted).
LEFTOVER_RE = re.compile(r"^\.(tmp|trash)_(.+)_(\d+)$")


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def crash_point(name: str) -> None:
    """Test hook of scripts/crash_campaign.py: REINFORGE_CRASH_AT=<name> SIGKILLs this process at
    that point: save:written|sealed|trashed|renamed, export:written|trashed|renamed,
    <label>:trashed of remove_dir (prune, rewind), and async:state (an asynchronous RL save
    that gathered its rows in flight, trainers/rl.py). Unset, it costs one environment lookup."""
    if os.environ.get("REINFORGE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """fsync every file, then every folder bottom-up: once `folder` is renamed, a power loss
    cannot expose a name whose data never reached the disk."""
    for dirpath, _, files in os.walk(folder, topdown=False):
        for f in files:
            _fsync(Path(dirpath) / f)
        _fsync(Path(dirpath))


def _hidden(path: Path, kind: str) -> Path:
    return path.with_name(f".{kind}_{path.name}_{os.getpid()}")


def remove_dir(path: Path, label: str) -> None:
    """Delete a folder without it ever being visible half-deleted under its own name."""
    trash = _hidden(path, "trash")
    if trash.exists():
        shutil.rmtree(trash)
    os.replace(path, trash)
    crash_point(f"{label}:trashed")
    shutil.rmtree(trash)


def _replace_dir(new: Path, final: Path, label: str) -> None:
    """Rename the complete folder `new` to `final`. An existing `final` is renamed to trash first
    and deleted only once `new` is in place (a directory cannot be renamed over a non-empty one)."""
    trash = _hidden(final, "trash")
    if final.exists():
        if trash.exists():
            shutil.rmtree(trash)
        os.replace(final, trash)
        crash_point(f"{label}:trashed")
    os.replace(new, final)
    _fsync(final.parent)
    crash_point(f"{label}:renamed")
    shutil.rmtree(trash, ignore_errors=True)


def _manifest(folder: Path) -> dict[str, int]:
    """{path relative to folder: size} of every file under it (sharded state included)."""
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why the step folder `path` cannot be loaded (no COMPLETE, a file missing or of the wrong
    size), or None when it can. A COMPLETE without a manifest (written before manifests
    existed) needs a non-empty trainer_state.pt."""
    path = Path(path)
    try:
        marker = json.loads((path / "COMPLETE").read_text())
    except FileNotFoundError:
        return "no COMPLETE marker"
    except ValueError:
        return "unreadable COMPLETE marker"
    files = marker.get("files") if isinstance(marker, dict) else {"trainer_state.pt": None}  # None: non-empty
    if not isinstance(files, dict):
        return "COMPLETE marker without a manifest"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        actual = f.stat().st_size
        if actual != size and (size is not None or actual == 0):
            return f"{name} has {actual} bytes, expected {size if size is not None else 'more'}"
    return None


def step_folders(ckpt_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Every `step_N` folder, complete or not, oldest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.match(p.name)))


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Loadable checkpoints (checkpoint_problem is None), oldest first."""
    return [(s, p) for s, p in step_folders(ckpt_dir) if checkpoint_problem(p) is None]


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> Path | None:
    """The newest loadable checkpoint; newer step folders that are not are reported and skipped."""
    for _, path in reversed(step_folders(ckpt_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        print(f"[reinforge] skipping {path}: {problem}", file=sys.stderr)
    return None


def save_checkpoint(ckpt_dir: str | os.PathLike, step: int, models: dict[str, torch.nn.Module],
                    state: dict[str, Any], cfg, keep_last: int = 2,
                    writers: tuple[Callable[[Path], dict | None], ...] = ()) -> Path:
    """Write `step_<step>/` (with the resolved `cfg` as config.yaml) atomically and prune old
    checkpoints (the newest `keep_last` step folders stay). Returns its path.

    `writers` are called with the temporary folder first and write their files there (the RL
    trainer's roles: workers/role.py), so those are part of the same manifest and rename; the
    dict a writer returns, if any, is added to `state`."""
    root = Path(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = _hidden(final, "tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for write in writers:
        state.update(write(tmp) or {})
    for name, model in models.items():
        save_model(model, str(tmp / f"{name}.safetensors"))  # handles tied embeddings
    torch.save(state, tmp / "trainer_state.pt")
    save_config(cfg, tmp / "config.yaml")
    crash_point("save:written")
    (tmp / "COMPLETE").write_text(json.dumps({"step": step, "files": _manifest(tmp)}))
    _sync_tree(tmp)
    crash_point("save:sealed")
    _replace_dir(tmp, final, "save")
    for _, old in step_folders(root)[:-keep_last] if keep_last > 0 else []:
        remove_dir(old, "prune")
    return final


def load_checkpoint(path: str | os.PathLike, models: dict[str, torch.nn.Module]) -> dict[str, Any]:
    """Load weights into `models` in place and return the trainer state."""
    path = Path(path)
    if (problem := checkpoint_problem(path)) is not None:
        raise FileNotFoundError(f"{path} is not a complete checkpoint ({problem}); "
                                f"pick another step folder or use --resume for the latest complete one")
    for name, model in models.items():
        f = path / f"{name}.safetensors"
        if not f.exists():
            raise FileNotFoundError(f"checkpoint {path} has no weights for {name!r}")
        load_model(model, str(f), strict=True)
    return torch.load(path / "trainer_state.pt", weights_only=False)


def write_export(out_dir: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Write a `from_pretrained` folder atomically: `write(folder)` fills `.tmp_<name>_<pid>`,
    which is then swapped in for `out_dir` (the previous export stays whole until then)."""
    out = Path(out_dir)
    tmp = _hidden(out, "tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write(tmp)
    _sync_tree(tmp)
    crash_point("export:written")
    _replace_dir(tmp, out, "export")
    return out


def export_hf(model, tokenizer, out_dir: str | os.PathLike, processor=None) -> Path:
    """A folder `from_pretrained` loads: `model`'s weights and config (LoRA merged) and the
    tokenizer (and a VLM's `processor`: its image processor), written atomically (write_export).
    The RL trainer's roles export themselves (TrainedRole.export: a Ray worker group streams the
    weights from its ranks' shards)."""

    def write(folder: Path) -> None:
        save_merged(model, folder)
        tokenizer.save_pretrained(folder)
        if processor is not None:
            from reinforge.models.vlm_processor import save_processor

            save_processor(processor, folder)

    return write_export(out_dir, write)


def clean_leftovers(run_dir: str | os.PathLike) -> list[Path]:
    """Delete the temporaries and trash that killed saves, prunes and exports left in run_dir and
    its checkpoints/; an export's trash whose folder is missing (killed between the two renames
    of _replace_dir) is that folder's last complete version and is renamed back. Call it only
    under the run-dir lock, when no live process can own them. Returns what was deleted."""
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / "checkpoints"):
        for p in sorted(folder.iterdir()) if folder.is_dir() else []:
            m = LEFTOVER_RE.match(p.name)
            if m is None:
                continue
            target = folder / m.group(2)
            if m.group(1) == "trash" and folder == run_dir and not target.exists():
                os.replace(p, target)
                continue
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            removed.append(p)
    return removed


def no_checkpoint(ckpt_dir: Path) -> int:
    """What resume does when there is nothing to resume from: say so, and start at step 0."""
    print(f"[reinforge] no checkpoint in {ckpt_dir}; starting from step 0", file=sys.stderr)
    return 0


class SingleModelCheckpoints:
    """save() / resume() of a one-model trainer (SFT, DPO, RM): weights, optimizer, scheduler,
    RNG and loader position. The trainer has run_dir, step_idx, model, opt, sched, loader, cfg, plan."""

    def save(self) -> Path:
        state = {"step": self.step_idx, "rng": rng_state(), "loader": self.loader.state_dict(),
                 "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()}
        return save_checkpoint(self.run_dir / "checkpoints", self.step_idx, {"model": self.model}, state,
                               self.plan.to_dict(), self.cfg.trainer.keep_last)

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
    """Lock `run_dir` (lock_run_dir), delete the leftovers of killed runs (clean_leftovers) and
    write the resolved config to run_dir/config.yaml, as every trainer's fit() does first.
    Returns the lock file: `with claim_run_dir(...):` holds the lock until the block ends."""
    lock = lock_run_dir(run_dir)
    try:
        clean_leftovers(run_dir)
        save_config(cfg, run_dir / "config.yaml")
    except BaseException:
        lock.close()
        raise
    return lock
