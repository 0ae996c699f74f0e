"""Crash safety of checkpoints and the HF export: a kill between any two file-system operations
of a save, prune or export (simulated by raising at the k-th rename, deletion or crash point)
leaves every COMPLETE folder loadable, `latest_checkpoint` on a loadable one, and `hf/` whole
(old or new); the start-up cleanup removes what the kill left; one real SIGKILL end to end."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from reinforge.trainers import checkpoint as ck


@dataclass
class Cfg:
    seed: int = 0


class Killed(Exception):
    """Stands for SIGKILL: the operation it interrupts does not happen, nothing after it runs."""


class Killer:
    """Counts operations (os.replace, each entry shutil.rmtree deletes, crash points) and raises
    Killed at the k-th; install() patches them for the duration of one call."""

    def __init__(self, k: int):
        self.k, self.n = k, 0
        self.real_replace = os.replace

    def tick(self, *_):
        self.n += 1
        if self.n == self.k:
            raise Killed

    def replace(self, src, dst):
        self.tick()
        self.real_replace(src, dst)

    def rmtree(self, path, ignore_errors=False):
        """Deletes one entry per operation, deepest first, as a killed rmtree leaves a folder."""
        if not os.path.exists(path):
            if ignore_errors:
                return
            raise FileNotFoundError(path)
        for dirpath, dirs, files in os.walk(path, topdown=False):
            for f in sorted(files):
                self.tick()
                os.unlink(os.path.join(dirpath, f))
            self.tick()
            os.rmdir(dirpath)

    def install(self, monkeypatch):
        monkeypatch.setattr(ck.os, "replace", self.replace)
        monkeypatch.setattr(ck.shutil, "rmtree", self.rmtree)
        monkeypatch.setattr(ck, "crash_point", self.tick)


def model(value: float) -> torch.nn.Linear:
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    return m


def save(root: Path, step: int, value: float, keep_last: int = 2) -> Path:
    return ck.save_checkpoint(root, step, {"model": model(value)}, {"step": step, "value": value}, Cfg(), keep_last)


def load(path: Path) -> float:
    """The value a checkpoint was saved with; raises unless weights and state both load and agree."""
    m = model(-1.0)
    state = ck.load_checkpoint(path, {"model": m})
    assert torch.all(m.weight == state["value"])
    return state["value"]


def complete_folders(root: Path) -> list[Path]:
    return [p for p in root.glob("step_*") if (p / "COMPLETE").exists()]


def every_kill(monkeypatch, action, check) -> int:
    """Run `action` killed at its 1st, 2nd, ... operation (undoing the patches after each) and
    call check() after every kill; returns how many kill points there were."""
    k = 1
    while True:
        killer = Killer(k)
        with monkeypatch.context() as m:
            killer.install(m)
            try:
                action()
            except Killed:
                pass
            else:
                return k - 1
        check(k)
        k += 1


def test_kill_anywhere_in_a_replacing_save_and_prune(tmp_path, monkeypatch):
    """step_1, step_2 exist; step_2 is saved again (a resumed run) with keep_last=1, so the save
    renames the old step_2 away and the prune removes step_1."""
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"

    def fresh():
        shutil.rmtree(run_dir, ignore_errors=True)
        save(root, 1, 1.0)
        save(root, 2, 2.0)

    def check(k):
        for p in complete_folders(root):
            load(p)  # every COMPLETE folder loads
        latest = ck.latest_checkpoint(root)
        assert (latest.name, load(latest)) in {("step_1", 1.0), ("step_2", 2.0), ("step_2", 2.5)}, k
        removed = ck.clean_leftovers(run_dir)
        assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == [], (k, removed)
        assert load(ck.latest_checkpoint(root)) == load(latest)
        fresh()

    fresh()
    points = every_kill(monkeypatch, lambda: save(root, 2, 2.5, keep_last=1), check)
    assert points >= 8  # crash points, two renames and the deletion of each file
    assert [p.name for _, p in ck.list_checkpoints(root)] == ["step_2"] and load(root / "step_2") == 2.5


def test_export_killed_anywhere_leaves_old_or_new_hf(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    old = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        new.lm_head.weight.add_(1.0)
    run_dir = tmp_path / "run"
    weights = {"old": old.lm_head.weight.detach().clone(), "new": new.lm_head.weight.detach().clone()}

    def which(path: Path) -> str:
        w = AutoModelForCausalLM.from_pretrained(path).lm_head.weight
        return next(name for name, ref in weights.items() if torch.equal(w, ref))

    def check(k):
        hf = run_dir / "hf"
        if hf.exists():  # before the cleanup: missing only between the two renames, never partial
            which(hf)
        ck.clean_leftovers(run_dir)
        assert which(hf) in ("old", "new"), k
        assert [p.name for p in run_dir.iterdir()] == ["hf"], k
        shutil.rmtree(run_dir)
        ck.export_hf(old, tok, hf)

    ck.export_hf(old, tok, run_dir / "hf")
    points = every_kill(monkeypatch, lambda: ck.export_hf(new, tok, run_dir / "hf"), check)
    assert points >= 5
    assert which(run_dir / "hf") == "new"


def test_latest_checkpoint_skips_folders_that_do_not_load(tmp_path, capsys):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        save(root, step, float(step), keep_last=0)
    (root / "step_4" / "trainer_state.pt").write_bytes(b"")  # truncated
    (root / "step_3" / "model.safetensors").unlink()
    assert ck.latest_checkpoint(root) == root / "step_2"
    err = capsys.readouterr().err
    assert "step_4: trainer_state.pt has 0 bytes" in err and "step_3: model.safetensors is missing" in err
    assert [s for s, _ in ck.list_checkpoints(root)] == [1, 2]
    with pytest.raises(FileNotFoundError, match="step_3 is not a complete checkpoint .model.safetensors is missing"):
        load(root / "step_3")
    # A checkpoint from before manifests (COMPLETE holds the step) loads when its state is there.
    (root / "step_2" / "COMPLETE").write_text("2")
    assert ck.checkpoint_problem(root / "step_2") is None and load(root / "step_2") == 2.0
    (root / "step_2" / "trainer_state.pt").unlink()
    assert ck.checkpoint_problem(root / "step_2") == "trainer_state.pt is missing"


def test_sharded_state_of_writers_is_in_the_manifest(tmp_path):
    def shards(d: Path):
        (d / "actor_sharded").mkdir()
        (d / "actor_sharded" / "__0_0.distcp").write_bytes(b"x" * 10)

    path = ck.save_checkpoint(tmp_path, 1, {"model": model(1.0)}, {"step": 1, "value": 1.0}, Cfg(), writers=(shards,))
    (path / "actor_sharded" / "__0_0.distcp").write_bytes(b"x" * 4)
    assert ck.checkpoint_problem(path) == "actor_sharded/__0_0.distcp has 4 bytes, expected 10"


def test_claiming_the_run_dir_cleans_leftovers(tmp_path):
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    save(root, 1, 1.0)
    for name in (".tmp_step_2_123", ".trash_step_1_77"):
        (root / name).mkdir()
        (root / name / "model.safetensors").write_bytes(b"partial")
    (run_dir / ".tmp_hf_5").mkdir()
    (run_dir / ".trash_critic_pretrained_9").mkdir()  # killed between an export's two renames
    (run_dir / ".trash_critic_pretrained_9" / "config.json").write_text("{}")
    (run_dir / "notes.tmp").write_text("the user's")
    with ck.claim_run_dir(run_dir, Cfg()):
        names = sorted(p.name for p in run_dir.iterdir())
        assert names == [".lock", "checkpoints", "config.yaml", "critic_pretrained", "notes.tmp"]
        assert (run_dir / "critic_pretrained" / "config.json").read_text() == "{}"  # put back
        assert [p.name for p in root.iterdir()] == ["step_1"]
    # Once the folder is back, a second trash of it is a leftover.
    (run_dir / ".trash_critic_pretrained_9").mkdir()
    assert ck.clean_leftovers(run_dir) == [run_dir / ".trash_critic_pretrained_9"]


def test_real_sigkill_between_the_renames_of_a_save(tmp_path):
    """REINFORGE_CRASH_AT kills a real process after the old step_2 was renamed away and before the
    new one is in place: --resume then takes step_1, and the claim removes both hidden copies."""
    root = tmp_path / "run" / "checkpoints"
    save(root, 1, 1.0)
    save(root, 2, 2.0)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path;"
            "from tests.test_checkpoint_atomic import save; save(Path(sys.argv[2]), 2, 2.5)")
    env = {**os.environ, "REINFORGE_CRASH_AT": "save:trashed"}
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parents[1]), str(root)], env=env)
    assert proc.returncode == -9
    hidden = sorted(p.name.rsplit("_", 1)[0] for p in root.iterdir() if p.name.startswith("."))  # less the pid
    assert hidden == [".tmp_step_2", ".trash_step_2"] and (root / "step_1").exists() and not (root / "step_2").exists()
    assert ck.latest_checkpoint(root) == root / "step_1"
    ck.clean_leftovers(root.parent)
    assert [p.name for p in root.iterdir()] == ["step_1"] and load(root / "step_1") == 1.0


def test_crash_campaign_runs_clean(tmp_path):
    """scripts/crash_campaign.py end to end, two trials of SFT: it exits 0 only if every check held."""
    script = Path(__file__).parents[1] / "scripts" / "crash_campaign.py"
    proc = subprocess.run([sys.executable, str(script), "--n", "2", "--trainers", "sft", "--seed", "3",
                           "--work", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, row = proc.stdout.splitlines()[-2:]
    assert header.split()[:2] == ["trainer", "trials"] and row.split()[:2] == ["sft", "2"]
