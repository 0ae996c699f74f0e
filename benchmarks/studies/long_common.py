"""Machinery of the studies on `long_addition` (worked 3-digit sums, 31-40 token responses):
one SFT base, arms x seeds run as parallel CLI processes, plots with a min/max band over seeds,
and "mean [min, max]" table cells.

The base (runs/studies/long_base/sft/hf) is made once and reused: task data (seed 0), a tiny
model (seed 0), and SFT_STEPS of SFT at a constant lr. Every arm starts from it; an arm's seed
is its trainer.seed and data.seed (sampling, prompt order), so the seeds of one arm differ only
in RL. A run whose metrics.jsonl already holds its final validation is not rerun, so a study
interrupted halfway resumes where it stopped (--fresh reruns everything).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, plt, save_plot, series, smooth, table  # noqa: F401  (table: re-exported for the studies)
from common import window_mean as window  # noqa: F401  (re-exported for the studies)

BASE = ROOT / "runs" / "studies" / "long_base"
TASK = {"digits": 3}
N_DATA = {"n_train": 4000, "n_test": 200, "n_sft": 8000}
# Sets the base's held-out greedy accuracy (see docs/results.md, "Studies on long_addition").
SFT = ["trainer.total_steps=200", "optim.lr=1e-3", "optim.lr_schedule=constant", "data.max_length=56"]
# Every arm: the first 100 held-out prompts, greedy only; responses may run to 2x the longest
# correct one (40 tokens with EOS) so that length has room to move both ways.
SHARED = ["data.max_val_samples=100", "trainer.val_sampled=never", "data.max_prompt_length=12",
          "rollout.max_response_length=80", "data.train_batch_size=8", "rollout.n=8",
          "reward.functions=[{name: long_addition}]", "trainer.export_hf=false", "trainer.report=false",
          "trainer.loggers=[jsonl]", "trainer.save_every=0"]


def parse(study: str, steps: int, **int_args: int) -> tuple[argparse.Namespace, Path]:
    """--steps, --seeds 0,1,2, --jobs (parallel runs), --fresh and the given integer options;
    -> (args, out/<study>/)."""
    ap = argparse.ArgumentParser()
    for name, default in {"steps": steps, **int_args}.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated trainer seeds")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    ap.add_argument("--fresh", action="store_true", help="rerun arms that already finished")
    args = ap.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(__file__).parent / "out" / study
    out.mkdir(parents=True, exist_ok=True)
    return args, out


def get_base() -> tuple[Path, dict]:
    """(SFT base folder, data paths), made on first use (2-4 minutes on one core)."""
    paths = {k: str(BASE / "data" / f"{k}.parquet") for k in ("train", "test", "sft")}
    hf = BASE / "sft" / "hf"
    if (hf / "config.json").exists():
        return hf, paths
    from reinforge.config.load import load_config
    from reinforge.config.sft import SFTConfig
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer, make_task_data
    from reinforge.trainers.sft import SFTTrainer

    make_task_data("long_addition", str(BASE / "data"), seed=0, **N_DATA, **TASK)
    make_tiny_model(build_char_tokenizer(), str(BASE / "model"), seed=0)
    overrides = [f"model.path={BASE / 'model'}", f"data.train_files=[{paths['sft']}]", f"trainer.run_dir={BASE / 'sft'}",
                 f"eval.prompt_files=[{paths['test']}]", "eval.reward_functions=[{name: long_addition}]",
                 "eval.max_prompt_length=12", "eval.max_response_length=48", "eval.max_samples=100", "eval.n=1",
                 "trainer.seed=1", "data.seed=1", *SFT]
    SFTTrainer(load_config(SFTConfig, "demo_sft", overrides)).fit(overwrite=True)
    return hf, paths


def _done(run_dir: Path, steps: int) -> bool:
    if not (run_dir / "metrics.jsonl").exists():
        return False
    return any(r["step"] == steps and "val/acc_greedy" in r for r in _rows(run_dir))


def run_arms(study: str, arms: dict[str, tuple[str, list[str]]], args, total_steps=None) -> dict[str, list[list[dict]]]:
    """Run every (arm, seed) as `reinforge train --config <preset> ...`, args.jobs at a time.

    arms: name -> (preset, overrides). total_steps(name) gives an arm's step count (default
    args.steps). -> name -> one metrics-row list per seed (in args.seeds order)."""
    base, paths = get_base()
    exe = str(Path(sys.executable).with_name("reinforge"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    jobs, dirs = [], {}
    for i, (name, (preset, overrides)) in enumerate(arms.items()):
        steps = total_steps(name) if total_steps else args.steps
        for seed in args.seeds:
            run_dir = ROOT / "runs" / "studies" / study / f"arm_{i}" / f"seed_{seed}"
            dirs[name, seed] = run_dir
            if _done(run_dir, steps) and not args.fresh:
                continue
            cmd = [exe, "train", "--config", preset, f"model.path={base}", f"data.train_files=[{paths['train']}]",
                   f"data.val_files=[{paths['test']}]", f"trainer.run_dir={run_dir}", f"trainer.total_steps={steps}",
                   f"trainer.seed={seed}", f"data.seed={seed}", *SHARED, *overrides, "--overwrite"]
            jobs.append((f"{name} seed {seed}", cmd, run_dir))
    running: list[tuple[str, subprocess.Popen, float, object]] = []
    while jobs or running:
        while jobs and len(running) < args.jobs:
            label, cmd, run_dir = jobs.pop(0)
            run_dir.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.parent / f"{run_dir.name}.log", "w")
            print(f"[study] start {label}", file=sys.stderr, flush=True)
            running.append((label, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), time.time(), log))
        time.sleep(2)
        for item in [r for r in running if r[1].poll() is not None]:
            label, proc, t0, log = item
            running.remove(item)
            log.close()
            print(f"[study] done {label}: rc {proc.returncode}, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            if proc.returncode != 0:
                raise SystemExit(f"run {label} failed; see its .log next to its run dir")
    return {name: [_rows(dirs[name, s]) for s in args.seeds] for name in arms}


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def band_plot(arms: dict[str, list[list[dict]]], key: str, title: str, ylabel: str, path: Path, k: int = 3) -> None:
    """Per arm: the mean over seeds of each seed's k-step moving mean, with a min/max band."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=110)
    for name, per_seed in arms.items():
        curves = [dict(zip(*_xy(rows, key, k))) for rows in per_seed]
        xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if not xs:
            continue
        ys = [[c[x] for c in curves] for x in xs]
        line, = ax.plot(xs, [statistics.fmean(y) for y in ys], label=f"{name} (n={len(curves)})", linewidth=1.8)
        ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.18)
    save_plot(fig, ax, title, ylabel, path)


def _xy(rows: list[dict], key: str, k: int) -> tuple[list[int], list[float]]:
    x, y = series(rows, key)
    return x, smooth(y, k)


def val(rows: list[dict], step: int | None = None, key: str = "val/acc_greedy") -> float:
    """Validation `key` at `step` (None: the last validation)."""
    vals = [r[key] for r in rows if key in r and (step is None or r["step"] == step)]
    return vals[-1] if vals else float("nan")


def cell(values: list[float]) -> str:
    """'mean [min, max]' over seeds."""
    v = [x for x in values if x == x]
    if not v:
        return "n/a"
    return f"{statistics.fmean(v):.3f} [{min(v):.3f}, {max(v):.3f}]"
