"""On-policy distillation on the demo's task: the demo's GRPO policy teaches the demo's SFT base.

    python benchmarks/distill_demo.py [--seeds 0 1 2] [--steps 120] [--lr 3e-5] [--mode reverse_kl|gkd]
                                      [--small] [--out runs/distill_demo]

For each seed: `reinforge demo --seed K` (skipped when its folder already holds the RL policy),
then `--config distill` from the SFT base (runs/demo[_seed<K>]/sft/hf) with the GRPO policy
(.../grpo/hf) as the teacher, the demo's data and GRPO settings (32 prompts a step, lr 3e-5,
held-out validation every 20 steps: greedy accuracy and mean@4). Prints, per seed, held-out
greedy accuracy and mean@4 of the base (step 0), the student, and the teacher; and the greedy
curve of distillation beside GRPO's from the same base (the demo's run), step for step.
--small: the student is a 0.38M-parameter model (hidden 128, 2 layers; the demo's is 3.0M)
given the demo's SFT (presets/demo_sft.yaml, the seed's SFT pairs) first; its SFT base is step 0.
docs/results.md, "On-policy distillation", holds the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def demo_dir(seed: int) -> Path:
    return Path("runs/demo" if seed == 0 else f"runs/demo_seed{seed}")


def val_rows(metrics: Path) -> dict[int, dict]:
    """step -> its last metrics row that holds validation results."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    return {r["step"]: r for r in rows if "val/acc_greedy" in r}


SMALL = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=352)


def small_student(seed: int, out: Path) -> Path:
    """A small model SFT'd as the demo's base is (260 steps of presets/demo_sft.yaml); -> its export."""
    from reinforge.cli.demo import trainer_seeds
    from reinforge.config.load import load_config
    from reinforge.config.sft import SFTConfig
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer
    from reinforge.trainers.sft import SFTTrainer

    d = out / f"small_seed{seed}"
    make_tiny_model(build_char_tokenizer(), str(d / "model"), seed=seed, **SMALL)
    overrides = [f"model.path={d / 'model'}", f"data.train_files=[{demo_dir(seed) / 'data/sft.parquet'}]",
                 f"trainer.run_dir={d / 'sft'}", "trainer.report=false", *trainer_seeds(seed)]
    SFTTrainer(load_config(SFTConfig, "demo_sft", overrides)).fit(overwrite=True)
    return d / "sft" / "hf"


def distill(seed: int, steps: int, out: Path, mode: str, student: Path, lr: float, label: str) -> Path:
    from reinforge.cli.demo import trainer_seeds
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    d = demo_dir(seed)
    run = out / f"{mode}_{label}_seed{seed}"
    overrides = [f"teacher.path={d / 'grpo/hf'}", f"model.path={student}",
                 f"data.train_files=[{d / 'data/train.parquet'}]", f"data.val_files=[{d / 'data/test.parquet'}]",
                 "data.max_prompt_length=8", "rollout.max_response_length=5", "data.train_batch_size=32",
                 "rollout.n=4", "data.val_batch_size=200", "data.max_val_samples=200", "rollout.val_n=4",
                 "trainer.pass_k=[1,4]", "trainer.val_sampled=always", "trainer.val_every=20",
                 "reward.functions=[{name: arithmetic}]", f"trainer.total_steps={steps}", f"actor.lr={lr}",
                 "actor.micro_batch_size=128", *trainer_seeds(seed), f"trainer.run_dir={run}",
                 "trainer.report=false", "trainer.export_hf=false", f"teacher.mode={mode}"]
    RLTrainer(load_config(RLConfig, "distill", overrides)).fit(overwrite=True)
    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--out", default="runs/distill_demo")
    p.add_argument("--mode", default="reverse_kl", choices=["reverse_kl", "gkd"], help="teacher.mode")
    p.add_argument("--lr", type=float, default=3e-5, help="actor.lr")
    p.add_argument("--small", action="store_true", help="a 0.38M-parameter student, SFT'd first")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for seed in args.seeds:
        if not (demo_dir(seed) / "grpo/hf").is_dir():
            subprocess.run([sys.executable, "-m", "reinforge.cli.main", "demo", "--seed", str(seed)], check=True)
        student = small_student(seed, Path(args.out)) if args.small else demo_dir(seed) / "sft/hf"
        run = distill(seed, args.steps, Path(args.out), args.mode, student, args.lr, "small" if args.small else "base")
        ours, grpo = val_rows(run / "metrics.jsonl"), val_rows(demo_dir(seed) / "grpo/metrics.jsonl")
        last = max(ours)
        print(f"seed {seed}: greedy base {ours[0]['val/acc_greedy']:.3f} -> student {ours[last]['val/acc_greedy']:.3f} "
              f"(teacher {grpo[max(grpo)]['val/acc_greedy']:.3f}); mean@4 base {ours[0]['val/acc_sampled']:.3f} -> "
              f"student {ours[last]['val/acc_sampled']:.3f}")
        print("  step  distill greedy  teacher's GRPO run greedy")
        for s in sorted(ours):
            g = grpo.get(s, {}).get("val/acc_greedy", float("nan"))
            print(f"  {s:>4}  {ours[s]['val/acc_greedy']:>14.3f}  {g:>11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
