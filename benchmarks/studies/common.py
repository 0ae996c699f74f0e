"""Shared machinery of the studies: a base policy, arms run from it, plots and a summary table.

The base is the demo's SFT policy (runs/demo/sft/hf and runs/demo/data when `make demo` has
run), otherwise it is made here with the demo's own data/SFT settings (a couple of minutes).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Every study's seed and validation: the first 100 held-out prompts, 4 samples each.
SHARED = ["trainer.seed=3", "data.max_val_samples=100", "rollout.val_n=4", "trainer.pass_k=[1,4]"]


def setup(study: str, **int_args: int):
    """Parse --steps (default 40) and the given integer options, make out/<study>/ and get the
    base. -> (args, output folder, base model folder, data paths)."""
    import argparse

    ap = argparse.ArgumentParser()
    for name, default in {"steps": 40, **int_args}.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args()
    out = Path(__file__).parent / "out" / study
    out.mkdir(parents=True, exist_ok=True)
    return (args, out, *get_base(out))


def get_base(out: Path) -> tuple[Path, dict]:
    """(base model folder, data paths) of an SFT'd tiny policy on the demo task."""
    demo = ROOT / "runs" / "demo"
    if (demo / "sft" / "hf" / "config.json").exists() and (demo / "data" / "train.parquet").exists():
        return demo / "sft" / "hf", {k: str(demo / "data" / f"{k}.parquet") for k in ("train", "test", "sft")}
    from reinforge.cli.demo import make_inputs, run_sft

    base = ROOT / "runs" / "studies" / "base"
    paths, _ = make_inputs(base, quick=False, seed=0)
    return run_sft(base, paths, 0, []), paths


def run_arm(name: str, preset: str, overrides: list[str], base: Path, paths: dict, out: Path) -> list[dict]:
    """One training run; returns its metrics rows (step 0 = validation before training)."""
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    run_dir = ROOT / "runs" / "studies" / out.name / name  # checkpoints stay out of the repo
    common = [f"model.path={base}", f"data.train_files=[{paths['train']}]", f"data.val_files=[{paths['test']}]",
              f"trainer.run_dir={run_dir}", "trainer.export_hf=false", "trainer.report=false",
              "trainer.loggers=[jsonl]", "reward.functions=[{name: arithmetic}]"]
    print(f"[study] arm {name}: {preset} {' '.join(overrides)}", file=sys.stderr, flush=True)
    RLTrainer(load_config(RLConfig, preset, common + overrides)).fit(overwrite=True)  # a rerun replaces the arm
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if key in r and r["step"] > 0]
    return [p[0] for p in pts], [p[1] for p in pts]


def smooth(y: list[float], k: int = 5) -> list[float]:
    return [statistics.fmean(y[max(0, i - k + 1): i + 1]) for i in range(len(y))]


def save_plot(fig, ax, title: str, ylabel: str, path: Path) -> None:
    """Title, axes, grid and legend of a study plot over training steps; written to `path`."""
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot(arms: dict[str, list[dict]], key: str, title: str, ylabel: str, path: Path, k: int = 5) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=110)
    for name, rows in arms.items():
        x, y = series(rows, key)
        if x:
            ax.plot(x, smooth(y, k), label=f"{name} (moving mean {k})", linewidth=1.8)
    save_plot(fig, ax, title, ylabel, path)


def window_mean(rows: list[dict], key: str, first: int | None = None, last: int | None = None) -> float:
    _, y = series(rows, key)
    if not y:
        return float("nan")
    y = y[:first] if first else y[-last:] if last else y
    return statistics.fmean(y)


def final_val(rows: list[dict], key: str = "val/acc_greedy") -> float:
    vals = [r[key] for r in rows if key in r]
    return vals[-1] if vals else float("nan")


def table(header: list[str], rows: list[list]) -> str:
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
