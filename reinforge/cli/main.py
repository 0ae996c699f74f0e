"""`reinforge <command>`: train | sft | dpo | rm | eval | data | model | report | demo.

Every training command takes `--config <preset or file.yaml>` plus dotted overrides
(`rollout.n=8 actor.lr=1e-5`). Errors in input print one clear line and exit non-zero.
"""
from __future__ import annotations

import argparse
import sys


def _add_train_args(p: argparse.ArgumentParser, default_config: str | None) -> None:
    p.add_argument("--config", default=default_config, help="preset name or YAML file")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest complete checkpoint in trainer.run_dir")
    p.add_argument("--resume-from", default=None, metavar="CHECKPOINT",
                   help="continue from this checkpoint folder (runs/x/checkpoints/step_N)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8")


def cmd_train(args) -> int:
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    cfg = load_config(RLConfig, args.config, args.overrides)
    trainer = RLTrainer(cfg)
    _save_resolved(cfg)
    final = trainer.fit(resume=args.resume_from or args.resume)
    _print_summary(final, cfg.trainer.run_dir)
    return 0


def _save_resolved(cfg) -> None:
    from pathlib import Path

    from reinforge.config.load import save_config

    save_config(cfg, Path(cfg.trainer.run_dir) / "config.yaml")


def _print_summary(final: dict, run_dir: str) -> None:
    keys = [k for k in sorted(final) if k.startswith("val/") and "/" not in k[4:]]
    shown = ", ".join(f"{k}={final[k]:.3f}" for k in keys)
    print(f"done. {shown}\nrun directory: {run_dir}")


def cmd_data(args) -> int:
    from reinforge.config.load import parse_overrides

    if args.action == "make":
        from reinforge.tasks import make_task_data

        opts = parse_overrides(args.options)
        paths = make_task_data(args.task, args.out, n_train=args.n_train, n_test=args.n_test, n_sft=args.n_sft,
                               seed=args.seed, **opts)
        for k, v in paths.items():
            print(f"{k}: {v}")
        return 0
    from reinforge.data import preprocess_gsm8k, preprocess_math

    fn = {"gsm8k": preprocess_gsm8k, "math": preprocess_math}[args.action]
    print(fn(args.input, args.output))
    return 0


def cmd_model(args) -> int:
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer

    tok = build_char_tokenizer()
    kw = {k: v for k, v in dict(hidden_size=args.hidden, num_layers=args.layers).items() if v}
    model = make_tiny_model(tok, args.out, seed=args.seed, **kw)
    print(f"tiny Qwen2 model ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters) "
          f"and character tokenizer written to {args.out}")
    return 0


def cmd_report(args) -> int:
    from reinforge.report import write_report

    print(write_report(args.run_dir))
    return 0


def _lazy(module: str, fn: str):
    def run(args) -> int:
        import importlib

        return getattr(importlib.import_module(module), fn)(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reinforge", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="RL training (PPO, GRPO, DAPO, GSPO, VAPO, ...)")
    _add_train_args(p, "grpo")
    p.set_defaults(fn=cmd_train)
    for name, module, helptext in (("sft", "reinforge.trainers.sft", "supervised fine-tuning"),
                                   ("dpo", "reinforge.trainers.dpo", "direct preference optimisation"),
                                   ("rm", "reinforge.trainers.rm", "reward-model training")):
        p = sub.add_parser(name, help=helptext)
        _add_train_args(p, None)
        p.set_defaults(fn=_lazy(module, "main"))
    p = sub.add_parser("eval", help="greedy / sampled accuracy and pass@k of a model on a prompt file")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-samples", type=int, default=200)
    p.add_argument("--max-response-length", type=int, default=32)
    p.add_argument("--max-prompt-length", type=int, default=64)
    p.add_argument("--reward", default="exact_match")
    p.set_defaults(fn=_lazy("reinforge.cli.evaluate", "main"))
    p = sub.add_parser("data", help="make built-in task data or preprocess GSM8K / MATH files")
    dsub = p.add_subparsers(dest="action", required=True)
    mk = dsub.add_parser("make", help="write train/test/sft/prefs parquet files of a built-in task")
    mk.add_argument("task")
    mk.add_argument("--out", required=True)
    mk.add_argument("--n-train", type=int, default=2000)
    mk.add_argument("--n-test", type=int, default=200)
    mk.add_argument("--n-sft", type=int, default=2000)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("options", nargs="*", help="task options, e.g. digits=2")
    for src in ("gsm8k", "math"):
        pp = dsub.add_parser(src, help=f"convert raw {src} rows (parquet/JSONL) into reinforge's RL schema")
        pp.add_argument("input")
        pp.add_argument("output")
    p.set_defaults(fn=cmd_data)
    p = sub.add_parser("model", help="write a tiny Qwen2 model with the character tokenizer (for tests/demo)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=0)
    p.add_argument("--layers", type=int, default=0)
    p.set_defaults(fn=cmd_model)
    p = sub.add_parser("report", help="plots and an HTML page for a run directory")
    p.add_argument("run_dir")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("demo", help="the main job: data -> SFT -> GRPO on a built-in task, on CPU")
    p.add_argument("--quick", action="store_true", help="a few steps only (used by the tests)")
    p.add_argument("--out", default="runs/demo")
    p.set_defaults(fn=_lazy("reinforge.cli.demo", "main"))
    return ap


def main(argv: list[str] | None = None) -> int:
    from reinforge.cli.errors import USER_ERRORS

    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # reinforge shows its own progress
    hf_logging.set_verbosity_error()  # e.g. the critic's "newly initialised value head" report
    try:
        return args.fn(args)
    except USER_ERRORS as e:
        print(f"reinforge: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reinforge: interrupted; resume with --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
