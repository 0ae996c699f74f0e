"""One tuning experiment of the demo: (cached) task data + tiny model + SFT base, then an RL run
from the base with the given overrides on top of presets/demo_grpo.yaml. Appends one line to
results.jsonl (settings, the held-out validation curve, timings) and prints it.

    python benchmarks/demo_tuning/tune.py --name lr1e-4 --sft-steps 600 actor.lr=1e-4 trainer.total_steps=100

Evaluation is always the RL trainer's validation on the held-out test prompts (never in SFT or
RL training data): greedy exact match, sampled mean@8 and pass@k.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).parent
ROOT = Path("runs/tuning")


def _patch_adam_eps(eps: float) -> None:
    """A large eps turns Adam's sign-like per-coordinate steps into gradient-proportional ones:
    coordinates whose RL gradient is small (mostly noise) then barely move."""
    import torch

    import reinforge.workers.actor as actor

    def make_optimizer(params, lr, weight_decay, betas=(0.9, 0.999)):
        return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, weight_decay=weight_decay,
                                 betas=tuple(betas), eps=eps, foreach=False)

    actor.make_optimizer = make_optimizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--ops", default="+")
    ap.add_argument("--pool", type=int, default=0, help="RL prompt pool: the first N train prompts (0: all)")
    ap.add_argument("--adam-eps", type=float, default=0.0,
                    help="experiment hook: AdamW eps for the RL actor (the engine fixes 1e-8; not a config key)")
    ap.add_argument("--sft", nargs="*", default=[], help="extra SFT overrides (part of the cache key)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.config.sft import SFTConfig
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer, make_task_data
    from reinforge.trainers.rl import RLTrainer
    from reinforge.trainers.sft import SFTTrainer

    task_key = f"d{args.digits}{'p' if '+' in args.ops else ''}{'m' if '-' in args.ops else ''}"
    data_dir, model_dir = ROOT / f"data_{task_key}", ROOT / "model"
    if not (data_dir / "task.json").exists():
        make_task_data("arithmetic", str(data_dir), n_train=4000, n_test=200, n_sft=2000, seed=0,
                       digits=args.digits, ops=args.ops)
    if not (model_dir / "config.json").exists():
        make_tiny_model(build_char_tokenizer(), str(model_dir), seed=0)
    train_file = data_dir / "train.parquet"
    if args.pool:
        from reinforge.data.io import load_rows, write_rows

        train_file = data_dir / f"train_{args.pool}.parquet"
        write_rows(load_rows(str(data_dir / "train.parquet"))[: args.pool], str(train_file))
    sft_dir = ROOT / f"sft_{task_key}_{args.sft_steps}{'_' + '_'.join(args.sft) if args.sft else ''}".replace("/", "-")
    t0 = time.perf_counter()
    if not (sft_dir / "hf" / "config.json").exists():
        cfg = load_config(SFTConfig, "demo_sft", [f"model.path={model_dir}", f"data.train_files=[{data_dir}/sft.parquet]",
                                                  f"trainer.run_dir={sft_dir}", f"trainer.total_steps={args.sft_steps}",
                                                  "trainer.progress=false", "trainer.loggers=[jsonl]", *args.sft])
        SFTTrainer(cfg).fit(overwrite=True)  # a crashed earlier SFT (no hf/ yet) is replaced
    sft_s = time.perf_counter() - t0
    run_dir = ROOT / f"rl_{args.name}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    if args.adam_eps:
        _patch_adam_eps(args.adam_eps)
    t0 = time.perf_counter()
    cfg = load_config(RLConfig, "demo_grpo", [f"model.path={sft_dir / 'hf'}", f"data.train_files=[{train_file}]",
                                              f"data.val_files=[{data_dir}/test.parquet]", f"trainer.run_dir={run_dir}",
                                              "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.report=false",
                                              *args.overrides])
    RLTrainer(cfg).fit()
    rl_s = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [{"step": r["step"], "greedy": round(r["val/acc_greedy"], 3), "sampled": round(r["val/acc_sampled"], 3),
              **{k[4:]: round(v, 3) for k, v in r.items() if k.startswith("val/pass@")}}
             for r in rows if "val/acc_greedy" in r]
    train = [r for r in rows if "critic/score/mean" in r]
    result = {"name": args.name, "task": task_key, "pool": args.pool, "adam_eps": args.adam_eps, "sft_steps": args.sft_steps, "sft": args.sft,
              "overrides": args.overrides, "curve": curve,
              "train_reward_first_last": [round(train[0]["critic/score/mean"], 3), round(train[-1]["critic/score/mean"], 3)],
              "sft_s": round(sft_s, 1), "rl_s": round(rl_s, 1),
              "rl_step_s": round(sum(r["timing_s/step"] for r in train) / len(train), 2)}
    with open(HERE / "results.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
