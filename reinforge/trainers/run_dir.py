"""The run directory: one run per folder, checked before anything loads, cut back on resume.

    trainer.run_dir/
        config.yaml         the resolved config, rewritten by every run
        .lock               held while a run writes here (checkpoint.lock_run_dir)
        checkpoints/ metrics.jsonl samples/ tensorboard/ hf/ report/ critic_pretrained/ wandb/
                            a run's artefacts (ARTEFACTS)
        ref_logps.pt        DPO's reference log-prob cache, keyed by data and model: kept across runs

The folder "holds a previous run" when one of ARTEFACTS exists and is not empty; config.yaml
alone, an empty folder or files of the user's do not count. A new run there must say what to do
with it: `--resume` / `--resume-from` continue it (its logs are cut back to the checkpoint's
step, `rewind`), `--overwrite` removes the artefacts first. Without either the run is refused,
so two runs never mix in one folder.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from reinforge.config.load import ConfigError
from reinforge.trainers.checkpoint import remove_dir, latest_checkpoint, step_folders

KEY = "trainer.run_dir"
ARTEFACTS = ("checkpoints", "metrics.jsonl", "samples", "tensorboard", "hf", "report", "critic_pretrained", "wandb")
TRASH = ".overwritten-"  # prefix of the hidden folder --overwrite moves the artefacts into before deleting


def _say(text: str) -> None:
    print(f"[reinforge] {text}", file=sys.stderr)


def check_writable(run_dir: str | os.PathLike) -> Path:
    """Create `run_dir` (with its parents) and a probe file in it. Every trainer calls this first,
    so a run_dir under a regular file, without permission or on a read-only disk stops the run
    with a ConfigError naming trainer.run_dir before any model loads."""
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is a file, not a folder" if blocker else e.strerror
        raise ConfigError(f"{KEY}={str(path)!r} cannot be written ({reason}); choose another {KEY}") from None
    return path


def _non_empty(p: Path) -> bool:
    return any(p.iterdir()) if p.is_dir() else p.stat().st_size > 0


def previous_run(run_dir: str | os.PathLike) -> list[str]:
    """The names in ARTEFACTS that `run_dir` holds, not empty: what makes it a previous run's folder."""
    root = Path(run_dir)
    return [name for name in ARTEFACTS if (root / name).exists() and _non_empty(root / name)]


def in_use(run_dir: str | os.PathLike) -> bool:
    """Whether a live process holds run_dir/.lock (checkpoint.lock_run_dir); probed without
    creating or truncating the file."""
    import fcntl

    try:
        f = open(Path(run_dir) / ".lock")
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def check_reuse(run_dir: str | os.PathLike, resume: bool, overwrite: bool) -> None:
    """Refuse (ConfigError) a run asked to both resume and overwrite, a run into a folder another
    live run is writing, and a new run into a folder that holds a previous one unless it resumes
    or overwrites. Reads only: a refused run leaves the folder as it was."""
    if resume and overwrite:
        raise ConfigError("--overwrite and --resume / --resume-from exclude each other: pick one")
    if in_use(run_dir):
        raise ConfigError(f"{KEY}={str(run_dir)!r} is in use by another running process")
    found = previous_run(run_dir)
    if found and not (resume or overwrite):
        raise ConfigError(f"{KEY}={str(run_dir)!r} holds a previous run ({', '.join(found)}); add --resume to "
                          f"continue it or --overwrite to replace it, or choose another {KEY}")


def clear_previous_run(run_dir: Path) -> list[str]:
    """--overwrite: move every artefact into one hidden folder, then delete it. A kill halfway
    leaves the rest in place (the next run is refused again) and the hidden folder, which the
    next --overwrite deletes. Returns the names removed."""
    trash = run_dir / f"{TRASH}{os.getpid()}"
    trash.mkdir(exist_ok=True)
    moved = [name for name in ARTEFACTS if (run_dir / name).exists() or (run_dir / name).is_symlink()]
    for name in moved:
        os.replace(run_dir / name, trash / name)
    for old in run_dir.glob(f"{TRASH}*"):
        shutil.rmtree(old, ignore_errors=True)
    if moved:
        _say(f"--overwrite: removed {', '.join(moved)} of the previous run in {run_dir}")
    return moved


def _cut_metrics(path: Path, first_new: int) -> int:
    """Drop metrics.jsonl rows with step >= first_new (and a line torn by a kill); the new file
    replaces the old one in one rename (also when only the last newline is missing, which the
    next row appended would run into). Returns how many lines went."""
    if not path.exists():
        return 0
    text = path.read_text()
    lines = [x for x in text.splitlines() if x.strip()]
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] < first_new:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            pass
    if len(kept) < len(lines) or (text and not text.endswith("\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(x + "\n" for x in kept))
        os.replace(tmp, path)
    return len(lines) - len(kept)


def _sample_step(p: Path) -> int:
    """K of samples/step_K.jsonl (validation) and samples/train_step_K.jsonl (training
    rollouts); -1 for any other name (never cut)."""
    m = re.fullmatch(r"(?:train_)?step_(\d+)\.jsonl", p.name)
    return int(m.group(1)) if m else -1


def rewind(run_dir: Path, step: int) -> int:
    """Cut the run's records back to the checkpoint of `step` (0: none, the run starts over), so
    that a resumed run logs each step once: metrics.jsonl rows, samples/step_K.jsonl,
    samples/train_step_K.jsonl and checkpoints/step_K with K >= first_new go, where
    first_new = step + 1 (0 when starting over).
    TensorBoard events cannot be cut in place: at step 0 tensorboard/ is deleted, otherwise the
    caller opens its writer with purge_step=first_new, which hides the later events. Returns first_new."""
    first_new = step + 1 if step else 0
    rows = _cut_metrics(run_dir / "metrics.jsonl", first_new)
    samples = [p for p in (run_dir / "samples").glob("*.jsonl") if _sample_step(p) >= first_new]
    for p in samples:
        p.unlink()
    later = [p for k, p in step_folders(run_dir / "checkpoints") if k >= first_new]
    for p in later:  # else a kill before the next save would leave them for --resume to pick
        remove_dir(p, "rewind")
    if first_new == 0:
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
    if rows or samples or later:
        _say(f"resume: dropped what the earlier run recorded from step {first_new} on ({rows} metrics rows, "
             f"{len(samples)} sample files, {len(later)} checkpoints)")
    return first_new


def resume_hint(run_dir: str | os.PathLike, command: list[str], overrides: list[str],
                resume_from: str | None = None) -> str:
    """How to continue a stopped run: `command` (`reinforge sft --config x`) with --resume when
    run_dir has a checkpoint, else the original --resume-from, else --overwrite, then `overrides`
    (last, so that more can be appended)."""
    ckpt = latest_checkpoint(Path(run_dir) / "checkpoints")
    if ckpt is not None:
        return f"the last checkpoint is {ckpt}; resume with: {shlex.join([*command, '--resume', *overrides])}"
    if resume_from:
        line = shlex.join([*command, "--resume-from", resume_from, *overrides])
        return f"no checkpoint in {run_dir} yet; resume with: {line}"
    return f"no checkpoint in {run_dir} yet; start again with: {shlex.join([*command, '--overwrite', *overrides])}"
