"""One demo setting on one seed, as `reinforge demo --seed K` runs it, with overrides on top of
presets/demo_sft.yaml and presets/demo_grpo.yaml. Appends one line to seeds.jsonl (setting,
seed, the held-out validation curve of the RL run, timings) and prints it.

    python benchmarks/demo_tuning/seeds.py --name sft200 --seed 1 --sft trainer.total_steps=200 -- trainer.total_steps=80

The data, model and SFT base are cached per (seed, SFT overrides) under --root, so RL settings
can be compared from the same base.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default="/tmp/demo_tuning", help="cache of data, models and SFT bases")
    ap.add_argument("--sft", nargs="*", default=[], help="SFT overrides (part of the cache key)")
    ap.add_argument("overrides", nargs="*", help="RL overrides")
    args = ap.parse_args()

    import torch

    from reinforge.cli.demo import make_inputs, run_rl, run_sft

    torch.set_num_threads(1)  # as the demo (reinforge/cli/demo.py _threads)
    key = hashlib.sha1(json.dumps(args.sft).encode()).hexdigest()[:8]
    base_dir = Path(args.root) / f"s{args.seed}_sft{key}"
    t0 = time.perf_counter()
    paths, _ = make_inputs(base_dir, False, args.seed)
    if not (base_dir / "sft" / "hf" / "config.json").exists():
        run_sft(base_dir, paths, args.seed, ["trainer.progress=false", *args.sft])
    sft_s = time.perf_counter() - t0
    out = Path(args.root) / f"rl_{args.name}_s{args.seed}"
    t0 = time.perf_counter()
    run_rl(out, base_dir / "sft" / "hf", paths, args.seed,
           ["trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.report=false", *args.overrides])
    rl_s = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    curve = [{"step": r["step"], "greedy": round(r["val/acc_greedy"], 3), "sampled": round(r["val/acc_sampled"], 3),
              **{k[4:]: round(v, 3) for k, v in r.items() if k.startswith("val/pass@")}}
             for r in rows if "val/acc_greedy" in r]
    result = {"name": args.name, "seed": args.seed, "sft": args.sft, "overrides": args.overrides, "curve": curve,
              "gain": round(curve[-1]["greedy"] - curve[0]["greedy"], 3), "sft_s": round(sft_s, 1), "rl_s": round(rl_s, 1)}
    with open(HERE / "seeds.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
