"""Wall time of `reinforge --help` and of every subcommand's `--help`, each a fresh process.

    python benchmarks/cli_startup.py               # this checkout, 5 runs per command
    python benchmarks/cli_startup.py --repeats 3 --root /tmp/old   # another checkout of reinforge

Each command runs as `python -m reinforge.cli.main <args> --help` with the checkout's root first
on PYTHONPATH (so an old worktree can be timed with the same interpreter), and the table shows
the median, min and max wall time in seconds. A help screen should not pay for torch or
transformers: the target is < 1 s for every row.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = [[], ["train"], ["sft"], ["dpo"], ["rm"], ["eval"], ["data"], ["data", "make"], ["data", "gsm8k"],
            ["model"], ["report"], ["demo"], ["presets"], ["config"]]


def time_once(argv: list[str], root: Path) -> float | None:
    """Seconds for one `--help` process, or None when the command does not exist there."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "reinforge.cli.main", *argv, "--help"], env=env, cwd=root,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    return elapsed if proc.returncode == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="checkout to time")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    print(f"root: {root}  python: {sys.executable}  repeats: {args.repeats}")
    print(f"{'command':<34} {'median s':>9} {'min s':>7} {'max s':>7}")
    for argv in COMMANDS:
        name = " ".join(["reinforge", *argv, "--help"])
        times = [time_once(argv, root) for _ in range(args.repeats)]
        if any(t is None for t in times):
            print(f"{name:<34} {'(no such command)':>25}")
            continue
        print(f"{name:<34} {statistics.median(times):9.2f} {min(times):7.2f} {max(times):7.2f}")


if __name__ == "__main__":
    main()
