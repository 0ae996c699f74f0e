"""`reinforge demo --task calculator [--quick] [--seed K] [--out DIR]`: a tiny model learns to use
a tool, on a 2-core CPU (issue 13; docs/agents.md).

    1. data      the `calculator` task: 3-digit x 2-digit products; SFT tool demonstrations, RL
                 prompts whose rows list the calculator tool, held-out test prompts
    2. model     the ~3M-parameter random-init model of the arithmetic demo
    3. no tools  SFT on plain answers ("123*45=" -> "5535"): held-out greedy accuracy with no tool
    4. sft       SFT on tool-use demonstrations (presets/demo_calculator_sft.yaml) -> the base
    5. rl        GRPO with the calculator tool (presets/demo_calculator_grpo.yaml), validated on
                 the held-out prompts before its first step (= the base, with the tool) and after

The SFT stage is kept deliberately short (a partial base: it has not yet learned to copy every
operand and result) so that RL has room; docs/agents.md has the measured tables.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from reinforge.cli.demo import run_rl, run_sft, stage_seeds, val_metrics

TASK = {"task": "calculator", "n_train": 2000, "n_test": 200, "n_sft": 2000}
QUICK_TASK = {"n_train": 32, "n_test": 8, "n_sft": 64}
QUICK_SFT = ["trainer.total_steps=3", "optim.warmup_steps=0", "eval.max_samples=8", "eval.n=2", "eval.pass_k=[1,2]"]
QUICK_RL = ["trainer.total_steps=2", "data.train_batch_size=4", "rollout.n=4", "rollout.val_n=2",
            "trainer.pass_k=[1,2]", "data.max_val_samples=8"]


def make_inputs(out: Path, quick: bool, seed: int) -> tuple[dict, dict]:
    """Task data (plus out/data/plain.parquet: the SFT prompts with plain answers) and the model."""
    from reinforge.data.io import load_rows, write_rows
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer, make_task_data

    task = {**TASK, **stage_seeds(seed), **(QUICK_TASK if quick else {})}
    paths = make_task_data("calculator", str(out / "data"), n_train=task["n_train"], n_test=task["n_test"],
                           n_sft=task["n_sft"], seed=task["data_seed"])
    plain = [{"prompt": r["prompt"][0]["content"], "response": r["ground_truth"]} for r in load_rows(paths["sft"])]
    paths["plain"] = write_rows(plain, str(out / "data" / "plain.parquet"))
    make_tiny_model(build_char_tokenizer(), str(out / "model"), seed=task["model_seed"])
    return paths, task


def no_tool_baseline(out: Path, paths: dict, seed: int, quick: bool) -> dict:
    """SFT on the plain answers, then greedy accuracy on the held-out prompts with no tool."""
    evaluate = [f"eval.prompt_files=[{paths['test']}]", "trainer.val_every=1000000"]  # once, after the last step
    base = run_sft(out, {**paths, "sft": paths["plain"]}, seed, evaluate + (QUICK_SFT if quick else []),
                   preset="demo_calculator_sft", name="sft_plain")
    rows = [json.loads(line) for line in (base.parent / "metrics.jsonl").read_text().splitlines()]
    return val_metrics(next(r for r in reversed(rows) if "val/acc_greedy" in r))


def format_table(report: dict) -> str:
    cols = {"no tools": report["no_tools"], "SFT + tool": report["base"], "GRPO + tool": report["rl"]}
    lines = [f"{'held-out (greedy/sampled)':<26}" + "".join(f"{c:>13}" for c in cols)]
    for key in ("acc_greedy", "acc_sampled"):
        lines.append(f"{key:<26}" + "".join(f"{m[key]:>13.3f}" if key in m else f"{'-':>13}" for m in cols.values()))
    lines.append("")
    lines += [f"time {stage:<17}{secs:>9.1f}s" for stage, secs in report["time_s"].items()]
    return "\n".join(lines)


def run_calculator_demo(args, threads: int) -> int:
    out = Path(args.out or ("runs/demo_calculator" if args.seed == 0 else f"runs/demo_calculator_seed{args.seed}"))
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t_all = t = time.perf_counter()
    paths, task = make_inputs(out, args.quick, args.seed)
    times["data+model"] = time.perf_counter() - t
    t = time.perf_counter()
    no_tools = no_tool_baseline(out, paths, args.seed, args.quick)
    times["sft (no tools)"] = time.perf_counter() - t
    t = time.perf_counter()
    base = run_sft(out, paths, args.seed, QUICK_SFT if args.quick else [], preset="demo_calculator_sft")
    times["sft (tool demos)"] = time.perf_counter() - t
    t = time.perf_counter()
    before, final = run_rl(out, base, paths, args.seed, QUICK_RL if args.quick else [], preset="demo_calculator_grpo")
    times["grpo"] = time.perf_counter() - t
    times["total"] = time.perf_counter() - t_all
    report = {"task": task, "seed": args.seed, "quick": args.quick, "torch_threads": threads, "no_tools": no_tools,
              "base": val_metrics(before), "rl": val_metrics(final), "time_s": times, "base_model": str(base),
              "rl_run_dir": str(out / "grpo")}
    report["delta_acc_greedy"] = report["rl"]["acc_greedy"] - report["base"]["acc_greedy"]
    (out / "demo_report.json").write_text(json.dumps(report, indent=2))
    print("\n" + format_table(report))
    print(f"\nheld-out greedy accuracy (seed {args.seed}): no tools {no_tools['acc_greedy']:.1%}, SFT + tool "
          f"{report['base']['acc_greedy']:.1%} -> GRPO + tool {report['rl']['acc_greedy']:.1%} "
          f"({report['delta_acc_greedy'] * 100:+.1f} points)")
    print(f"run directory: {out}  (summary: {out / 'demo_report.json'})")
    return 0
