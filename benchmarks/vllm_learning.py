"""The demo task trained with rollout.backend=vllm against the lean engine, at equal samples.

    .venv-vllm/bin/python benchmarks/vllm_learning.py --seeds 0 1 2

For each seed: the demo's data, tiny model and SFT base (`reinforge demo`'s stages, run once),
then the demo's GRPO stage (presets/demo_grpo.yaml: 120 steps of 32 prompts x 8 samples) twice
from that base, once on the lean engine and once on vLLM's CPU engine (enforce_eager, 1 GiB KV
cache); the same seeds, batches and number of samples. Prints each run's held-out greedy accuracy
(its own backend's greedy validation on the 200 held-out prompts) and the difference, and writes
runs/vllm_learning/summary.json. Needs vLLM (`make vllm-venv`); one thread, as the demo.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

BACKENDS = {"lean": [], "vllm": ["rollout.backend=vllm", "rollout.enforce_eager=true", "rollout.cpu_kv_cache_gb=1",
                                 "trainer.device=cpu"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/vllm_learning")
    ap.add_argument("--quick", action="store_true", help="the demo's quick settings (a smoke run)")
    args = ap.parse_args()
    import torch

    from reinforge.cli.demo import QUICK_RL, QUICK_SFT, make_inputs, run_rl, run_sft, val_metrics

    torch.set_num_threads(1)
    summary = []
    for seed in args.seeds:
        root = Path(args.out) / f"seed{seed}"
        paths, _ = make_inputs(root, args.quick, seed)
        base = run_sft(root, paths, seed, QUICK_SFT if args.quick else [])
        row = {"seed": seed}
        for name, extra in BACKENDS.items():
            t = time.perf_counter()
            before, final = run_rl(root / name, base, paths, seed, (QUICK_RL if args.quick else []) + extra)
            row[name] = {"base": val_metrics(before)["acc_greedy"], "final": val_metrics(final)["acc_greedy"],
                         "seconds": round(time.perf_counter() - t, 1)}
            gc.collect()  # the vLLM engine shut down before the next run
            print(f"seed {seed} {name}: held-out greedy {row[name]['base']:.1%} -> {row[name]['final']:.1%} "
                  f"({row[name]['seconds']} s)", flush=True)
        row["vllm_minus_lean_points"] = round(100 * (row["vllm"]["final"] - row["lean"]["final"]), 1)
        summary.append(row)
        print(f"seed {seed}: vllm - lean = {row['vllm_minus_lean_points']:+.1f} points", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
