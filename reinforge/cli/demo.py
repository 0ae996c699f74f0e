"""`reinforge demo [--quick] [--seed K] [--out DIR]`: the whole pipeline on a 2-core CPU, in minutes.

    1. data   built-in arithmetic task: SFT pairs, RL prompts, held-out test prompts
    2. model  a ~3M-parameter Qwen2 with a character tokenizer, random init
    3. sft    presets/demo_sft.yaml -> the base policy (out/sft/hf)
    4. rl     presets/demo_grpo.yaml from the base -> the RL policy (out/grpo/hf)

Both policies are judged by the same validation (greedy exact match on the held-out test
prompts, never seen in SFT or RL): the RL run validates before its first step (= the base)
and after its last. `--quick` runs a handful of steps of each stage (the CI check).

`--moe`: the policy is a tiny Qwen3-MoE (models/tiny.make_tiny_moe_model: MOE_MODEL's shape, the
same character tokenizer) and GRPO replays the rollout's routing (MOE_RL: actor.router_replay=
rollout, a small load-balancing loss); the stages and presets are the same.

`--seed K` changes everything random (stage_seeds): the task data (which prompts are SFT, RL and
held-out test prompts), the model's init, and the SFT and RL runs' seeds (example order, prompt
order, sampling). `reinforge demo --task addition` is this demo too (`make demo` runs the chain_sum
demo). Each run replaces the previous demo run in its out dir (files rewritten, trainers'
fit(overwrite=True)), so the demo can be repeated.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

# The built-in task and tiny model of the demo (not a config preset: no trainer reads these keys).
DEMO_TASK = {"task": "arithmetic", "options": {"digits": 2, "ops": "+"}, "n_train": 4000, "n_test": 200,
             "n_sft": 2000}

# A few steps of each stage: the pipeline end to end in well under a minute.
QUICK_SFT = ["trainer.total_steps=5", "optim.warmup_steps=0"]
QUICK_RL = ["trainer.total_steps=2", "data.train_batch_size=4", "rollout.n=4", "rollout.val_n=2",
            "trainer.pass_k=[1,2]", "data.max_val_samples=16"]
QUICK_TASK = {"n_train": 64, "n_test": 16, "n_sft": 256}

# --moe: the MoE policy's shape (every layer sparse; 7.1M parameters, 2.4M active a token), its
# SFT length (held-out greedy 0.365 at 300 steps and 0.625 at 400 on seed 0: 320 leaves GRPO
# headroom, as the dense demo's 260 does) and its GRPO overrides.
MOE_MODEL = {"family": "qwen3_moe", "hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
             "expert_size": 256, "num_experts": 8, "top_k": 2}
MOE_SFT = ["trainer.total_steps=320"]
MOE_RL = ["actor.router_replay=rollout", "actor.router_aux_loss_coef=0.001"]


def stage_seeds(seed: int) -> dict[str, int]:
    """Every seed of a demo run from its --seed. The trainers get seed + 1 so that seed 0 keeps
    the seeds the presets had before --seed existed (data and model 0, trainers 1)."""
    return {"data_seed": seed, "model_seed": seed, "train_seed": seed + 1}


def trainer_seeds(seed: int) -> list[str]:
    """Overrides for an SFT or RL run: the global seed and the data-order seed."""
    k = stage_seeds(seed)["train_seed"]
    return [f"trainer.seed={k}", f"data.seed={k}"]


def make_inputs(out: Path, quick: bool, seed: int, moe: bool = False) -> tuple[dict, dict]:
    """Task data and the random tiny model (moe: MOE_MODEL's); returns (data paths, task settings)."""
    from reinforge.models.tiny import make_tiny_model, make_tiny_moe_model
    from reinforge.tasks import build_char_tokenizer, make_task_data

    task = {**DEMO_TASK, **stage_seeds(seed)}
    if quick:
        task.update(QUICK_TASK)
    paths = make_task_data(task["task"], str(out / "data"), n_train=task["n_train"], n_test=task["n_test"],
                           n_sft=task["n_sft"], seed=task["data_seed"], **task["options"])
    if moe:
        make_tiny_moe_model(build_char_tokenizer(), str(out / "model"), seed=task["model_seed"], **MOE_MODEL)
    else:
        make_tiny_model(build_char_tokenizer(), str(out / "model"), seed=task["model_seed"])
    return paths, task


def run_sft(out: Path, paths: dict, seed: int, extra: list[str], preset: str = "demo_sft", name: str = "sft") -> Path:
    """SFT of out/model on the SFT pairs (presets/<preset>.yaml + `extra` overrides) in out/<name>;
    returns the base."""
    from reinforge.config.load import load_config
    from reinforge.config.sft import SFTConfig
    from reinforge.trainers.sft import SFTTrainer

    overrides = [f"model.path={out / 'model'}", f"data.train_files=[{paths['sft']}]", f"trainer.run_dir={out / name}",
                 *trainer_seeds(seed)]
    cfg = load_config(SFTConfig, preset, overrides + extra)
    SFTTrainer(cfg).fit(overwrite=True)  # replaces a previous demo's SFT run; writes out/<name>/config.yaml
    return out / name / "hf"


def run_rl(out: Path, base: Path, paths: dict, seed: int, extra: list[str],
           preset: str = "demo_grpo", name: str = "grpo") -> tuple[dict, dict]:
    """GRPO from `base` (presets/<preset>.yaml + `extra` overrides) in out/<name>; returns
    (validation metrics at step 0 = the base, final metrics)."""
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    run_dir = out / name
    overrides = [f"model.path={base}", f"data.train_files=[{paths['train']}]", f"data.val_files=[{paths['test']}]",
                 f"trainer.run_dir={run_dir}", *trainer_seeds(seed)]
    cfg = load_config(RLConfig, preset, overrides + extra)
    final = RLTrainer(cfg).fit(overwrite=True)  # replaces a previous demo's RL run; writes run_dir/config.yaml
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    before = next(r for r in rows if r["step"] == 0)
    return before, final


def val_metrics(m: dict) -> dict:
    return {k[4:]: v for k, v in m.items() if k.startswith("val/") and k.count("/") == 1}


def format_table(report: dict) -> str:
    b, r = report["base"], report["rl"]
    keys = ["acc_greedy", "acc_sampled"] + sorted(k for k in b if k.startswith("pass@"))
    lines = [f"{'metric (held-out)':<22}{'SFT base':>10}{'RL':>10}{'delta':>10}"]
    for k in keys:
        if k in b and k in r:
            lines.append(f"{k:<22}{b[k]:>10.3f}{r[k]:>10.3f}{r[k] - b[k]:>+10.3f}")
    lines.append("")
    lines += [f"time {stage:<17}{secs:>9.1f}s" for stage, secs in report["time_s"].items()]
    return "\n".join(lines)


def main(args) -> int:
    import torch

    before = torch.get_num_threads()
    try:
        if getattr(args, "task", "arithmetic") == "chain_sum":
            from reinforge.cli.demo_chain_sum import run_chain_sum_demo

            return run_chain_sum_demo(args, _threads())
        if getattr(args, "agent", None) and getattr(args, "task", "arithmetic") != "calculator":
            raise SystemExit("reinforge demo: --agent trains the calculator task's agent (--task calculator)")
        if getattr(args, "task", "arithmetic") == "calculator":
            from reinforge.cli.demo_calculator import run_calculator_demo

            return run_calculator_demo(args, _threads())
        if getattr(args, "task", "arithmetic") == "count_shapes":
            from reinforge.cli.demo_vision import run_vision_demo

            return run_vision_demo(args, _threads())
        if getattr(args, "text_only", False):
            raise SystemExit("reinforge demo: --text-only is the control of --task count_shapes")
        return run_demo(args, _threads())
    finally:
        torch.set_num_threads(before)  # in-process callers (tests) keep their setting


def _threads() -> int:
    """One torch thread unless OMP_NUM_THREADS says otherwise. On a 2-core machine shared with
    other jobs, two OpenMP threads spin-wait on each other: an SFT step of the tiny model took
    11 s with 2 threads and 0.2 s with 1 (benchmarks/demo_tuning/README.md). On an idle machine 1
    thread costs little at this model size, and the demo still fits its budget."""
    import os

    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    return torch.get_num_threads()


def run_demo(args, threads: int) -> int:
    moe = getattr(args, "moe", False)
    name = "runs/demo_moe" if moe else "runs/demo"
    out = Path(args.out or (name if args.seed == 0 else f"{name}_seed{args.seed}"))
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t_all = t = time.perf_counter()
    paths, task = make_inputs(out, args.quick, args.seed, moe)
    times["data+model"] = time.perf_counter() - t
    t = time.perf_counter()
    base = run_sft(out, paths, args.seed, (MOE_SFT if moe else []) + (QUICK_SFT if args.quick else []))
    times["sft"] = time.perf_counter() - t
    t = time.perf_counter()
    before, final = run_rl(out, base, paths, args.seed, (QUICK_RL if args.quick else []) + (MOE_RL if moe else []))
    times["rl"] = time.perf_counter() - t
    times["total"] = time.perf_counter() - t_all
    report = {"task": task, "moe": MOE_MODEL if moe else None, "seed": args.seed, "quick": args.quick, "torch_threads": threads, "base": val_metrics(before),
              "rl": val_metrics(final), "time_s": times, "base_model": str(base), "rl_run_dir": str(out / "grpo"), "rl_model": str(out / "grpo" / "hf")}
    report["delta_acc_greedy"] = report["rl"]["acc_greedy"] - report["base"]["acc_greedy"]
    (out / "demo_report.json").write_text(json.dumps(report, indent=2))
    print("\n" + format_table(report))
    print(f"\nheld-out greedy accuracy (seed {args.seed}): SFT base {report['base']['acc_greedy']:.1%} -> RL "
          f"{report['rl']['acc_greedy']:.1%} ({report['delta_acc_greedy'] * 100:+.1f} points)")
    print(f"run directory: {out}  (RL run: {out / 'grpo'}, report: {out / 'grpo' / 'report'}, "
          f"summary: {out / 'demo_report.json'})")
    return 0
