"""The run directory through the real CLI (`python -m reinforge.cli.main sft ...` in a
subprocess): a new run never mixes with a previous one, a bad trainer.run_dir stops the run
before the model loads, resume cuts the records back to the checkpoint, SIGTERM stops like
Ctrl-C with the command that resumes, non-finite metrics reach metrics.jsonl as null. Every
failure exits 2 (128 + signal for SIGTERM) with one line naming the key or folder, no traceback."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reinforge.trainers.run_dir import previous_run

CLI = [sys.executable, "-m", "reinforge.cli.main"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # one intra-op thread: far faster for the tiny model


def sft_args(model_dir: str, data: dict, run_dir, **extra) -> list[str]:
    base = {"model.path": model_dir, "data.train_files": f"[{data['sft']}]", "data.max_length": 16,
            "data.batch_size": 16, "optim.micro_batch_size": 16, "trainer.total_steps": 2, "optim.warmup_steps": 0,
            "trainer.run_dir": str(run_dir), "trainer.loggers": "[jsonl]", "trainer.progress": False,
            "trainer.export_hf": False}
    base.update(extra)
    return ["sft", *(f"{k}={v}" for k, v in base.items())]


def run_cli(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=ENV, timeout=timeout)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root -> its bytes (None for a folder); the lock file's mtime is not compared."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def steps(run_dir: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, arith_data, tmp_path_factory) -> Path:
    """A finished 2-step SFT run (checkpoint step_2, metrics rows 1 and 2, TensorBoard events):
    each test works on a copy."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    r = run_cli(sft_args(tiny_model_dir, arith_data, run_dir, **{"trainer.loggers": "[jsonl,tensorboard]"}))
    assert r.returncode == 0, r.stderr
    return run_dir


@pytest.mark.parametrize("files, expected", [
    ({}, []),
    ({"config.yaml": "a: 1\n", "notes.txt": "mine", "ref_logps.pt": "cache"}, []),
    ({"metrics.jsonl": "", "samples/": None}, []),  # what a run killed while starting leaves
    ({"metrics.jsonl": '{"step": 0}\n'}, ["metrics.jsonl"]),
    ({"checkpoints/step_1/COMPLETE": "1"}, ["checkpoints"]),
    ({"samples/step_0.jsonl": "{}\n", "hf/config.json": "{}"}, ["samples", "hf"]),
])
def test_what_counts_as_a_previous_run(tmp_path, files, expected):
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.mkdir() if text is None else p.write_text(text)
    assert previous_run(tmp_path) == expected


# Each case: (tmp folder, a copy of finished_run) -> run_dir, extra flags, texts the error names,
# and what the test must hold on to while the CLI runs (a lock), if anything.
def _blocked_by_file(tmp: Path, run: Path):
    (tmp / "afile").write_text("x")
    return tmp / "afile" / "run", [], ["trainer.run_dir", str(tmp / "afile"), "is a file"], None


def _read_only(tmp: Path, run: Path):
    if os.geteuid() == 0:
        pytest.skip("root may write to a read-only folder")
    (tmp / "ro").mkdir(mode=0o500)
    return tmp / "ro" / "run", [], ["trainer.run_dir", str(tmp / "ro" / "run"), "Permission denied"], None


def _previous_run(tmp: Path, run: Path):
    return run, [], ["trainer.run_dir", str(run), "previous run", "--resume", "--overwrite"], None


def _both_flags(tmp: Path, run: Path):
    return run, ["--resume", "--overwrite"], ["--overwrite", "--resume", "exclude each other"], None


def _in_use(tmp: Path, run: Path):
    from reinforge.trainers.checkpoint import lock_run_dir

    return run, ["--resume"], ["trainer.run_dir", str(run), "in use by another running process"], lock_run_dir(run)


@pytest.mark.parametrize("case", [_blocked_by_file, _read_only, _previous_run, _both_flags, _in_use])
def test_refusals_leave_the_run_dir_untouched(tiny_model_dir, arith_data, finished_run, tmp_path, case):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    run_dir, flags, named, held = case(tmp_path, run)
    before = snapshot(tmp_path)
    r = run_cli([*sft_args(tiny_model_dir, arith_data, run_dir, **{"trainer.total_steps": 3}), *flags])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("reinforge: error: "), r.stderr
    for text in named:
        assert text in r.stderr, (text, r.stderr)
    assert snapshot(tmp_path) == before
    if held is not None:
        held.close()


def test_overwrite_replaces_the_previous_run(tiny_model_dir, arith_data, finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "notes.txt").write_text("the user's")
    r = run_cli([*sft_args(tiny_model_dir, arith_data, run, **{"trainer.total_steps": 1}), "--overwrite"])
    assert r.returncode == 0, r.stderr
    assert "--overwrite: removed checkpoints, metrics.jsonl, tensorboard" in r.stderr, r.stderr
    assert steps(run) == [1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]
    assert not (run / "tensorboard").exists()  # jsonl only this time: nothing of the old run left
    assert (run / "notes.txt").read_text() == "the user's"
    assert not list(run.glob(".overwritten-*"))


def test_resume_cuts_what_was_recorded_after_the_checkpoint(tiny_model_dir, arith_data, finished_run, tmp_path):
    """A killed run logged steps 3 and 4 (one line torn), wrote samples and began a step_4 save
    after its last checkpoint step_2: resume drops all of it, then logs each step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "stale": 1}\n{"step": 4, "sta')
    (run / "samples").mkdir()
    for k in (2, 3):
        (run / "samples" / f"step_{k}.jsonl").write_text("{}\n")
    (run / "checkpoints" / "step_4").mkdir()
    time.sleep(1.1)  # TensorBoard orders event files by the second in their names
    with SummaryWriter(str(run / "tensorboard")) as tb:
        for k in (3, 4):
            tb.add_scalar("train/loss", 999.0, k)

    r = run_cli([*sft_args(tiny_model_dir, arith_data, run, **{"trainer.total_steps": 3,
                                                               "trainer.loggers": "[jsonl,tensorboard]"}), "--resume"])
    assert r.returncode == 0, r.stderr
    assert f"resuming from {run / 'checkpoints' / 'step_2'} at step 2" in r.stderr, r.stderr
    assert "2 metrics rows, 1 sample files, 1 checkpoints" in r.stderr, r.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3] and "stale" not in rows[2]
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step_2.jsonl"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_3"]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3] and 999.0 not in [e.value for e in loss]
    assert loss[2].value == pytest.approx(rows[2]["train/loss"])


def test_sigterm_stops_with_the_resume_command(tiny_model_dir, arith_data, tmp_path):
    """SIGTERM (what Slurm sends) mid-run: exit 143 and the command that continues; that command
    (with fewer steps) finishes the run with every step logged once."""
    run = tmp_path / "run"
    args = sft_args(tiny_model_dir, arith_data, run, **{"trainer.total_steps": 100000, "trainer.save_every": 3})
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.monotonic() + 120
    while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().count("\n") >= 4):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "reinforge: stopped by SIGTERM at step" in err, err
    command = shlex.split(err.split("resume with: ")[1].splitlines()[0])
    assert command[:3] == ["reinforge", "sft", "--resume"] and f"trainer.run_dir={run}" in command
    last = int(Path(err.split("the last checkpoint is ")[1].split(";")[0]).name.removeprefix("step_"))
    assert last >= 3 and last % 3 == 0
    r = run_cli([*command[1:], f"trainer.total_steps={last + 2}"])
    assert r.returncode == 0, r.stderr
    assert steps(run) == list(range(1, last + 3))


def test_nonfinite_metrics_are_logged_as_null(tiny_model_dir, arith_data, tmp_path):
    """lr=1e30 sends the weights to ~1e30 after step 1: step 2's loss is NaN. It is logged as
    null with nonfinite/count, warned about on stderr, and the skipped step does not stop the run."""
    run = tmp_path / "run"
    r = run_cli(sft_args(tiny_model_dir, arith_data, run, **{"optim.lr": 1e30}))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["train/loss"] > 0 and "nonfinite/count" not in rows[0]
    assert rows[1]["train/loss"] is None and rows[1]["train/nonfinite_skipped"] == 1.0
    assert rows[1]["nonfinite/count"] == sum(v is None for v in rows[1].values()) >= 1
    assert "[reinforge] step 2: non-finite train/loss=nan" in r.stderr, r.stderr


def test_report_reads_null_metrics(tmp_path):
    """A null in a plotted metric is a gap in its curve, not a crash."""
    from reinforge.report import write_report
    from reinforge.report.render import read_metrics

    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "critic/score/mean": 0.5}\n{"step": 2, "critic/score/mean": null, "nonfinite/count": 1.0}\n'
        '{"step": 3, "critic/score/mean": 0.7}\n{"step": 4, "critic/sc')
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["critic/score/mean"] != rows[1]["critic/score/mean"]
    assert "3 logged steps" in write_report(tmp_path).read_text()
    assert (tmp_path / "report" / "reward.png").exists()


def _sft_trainer(model_dir: str, data: dict, run_dir: Path, **extra):
    from reinforge.config.load import load_config
    from reinforge.config.sft import SFTConfig
    from reinforge.trainers.sft import SFTTrainer

    return SFTTrainer(load_config(SFTConfig, None, sft_args(model_dir, data, run_dir, **extra)[1:]))


def test_fit_from_python_refuses_then_overwrites(tiny_model_dir, arith_data, finished_run, tmp_path):
    """The check the CLI makes before loading the model is fit()'s own too."""
    from reinforge.config.load import ConfigError

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    trainer = _sft_trainer(tiny_model_dir, arith_data, run, **{"trainer.total_steps": 1})
    with pytest.raises(ConfigError, match="holds a previous run.*--overwrite"):
        trainer.fit()
    assert snapshot(run) == before
    trainer.fit(overwrite=True)
    assert steps(run) == [1]


def test_signal_during_a_save_takes_effect_after_it(tiny_model_dir, arith_data, tmp_path):
    """SIGTERM arriving while a checkpoint is written: the save completes, then the run stops."""
    from reinforge.trainers.checkpoint import checkpoint_problem
    from reinforge.trainers.loop import Terminated

    trainer = _sft_trainer(tiny_model_dir, arith_data, tmp_path, **{"trainer.total_steps": 3, "trainer.save_every": 1})
    real_save, handler = trainer.save, signal.getsignal(signal.SIGTERM)

    def save_hit_by_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        return real_save()

    trainer.save = save_hit_by_sigterm
    with pytest.raises(Terminated):
        trainer.fit()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_1"]
    assert checkpoint_problem(tmp_path / "checkpoints" / "step_1") is None
    assert signal.getsignal(signal.SIGTERM) is handler  # fit() put the old handler back
