"""`reinforge demo --task chain_sum [--quick] [--seed K] [--out DIR]`: a real pretrained model,
SmolLM2-135M-Instruct, post-trained on a reasoning-gym task on a 2-core CPU (issue 35).

    1. model  smollm2-135m-instruct from the pretrained registry (models/pretrained.py: fetched
              and converted once, then cached under $REINFORGE_CACHE)
    2. data   reasoning-gym's chain_sum (TASK: sums and differences of 2 or 3 one-digit numbers)
              as veRL rows (data/reasoning_gym.py): held-out test prompts drawn first (the task's
              own mix of 2- and 3-term questions), then RL prompts and SFT pairs (the task's own
              answers) that ask no test question
    3. base   the pretrained model on the held-out prompts: greedy, sampled mean@n and pass@k
    4. sft    a short SFT warm start on the task's answers (presets/demo_chain_sum_sft.yaml)
    5. grpo   GRPO from the SFT policy with the task's own scorer as the reward
              (presets/demo_chain_sum_grpo.yaml), validated before its first step (= after SFT,
              greedy) and after its last (greedy, sampled, pass@k)

Every evaluation is the RL trainer's validation with the GRPO preset's generation settings (the
same engine, dtype, prompt and response lengths), so base, SFT and final numbers compare. The
time of each stage is printed twice: wall seconds and this process's CPU seconds (user + system,
getrusage), the budget the issue sets (10 CPU-minutes on 2 cores).
"""
from __future__ import annotations

import json
import resource
import time
from pathlib import Path

from reinforge.cli.demo import stage_seeds, trainer_seeds, val_metrics

MODEL = "smollm2-135m-instruct"
# The task: 2 or 3 terms of 1 digit each ("State the final answer to the following arithmetic
# problem: 4 - 7 + 2 ="), on which the base is ~0.2-0.3 greedy. A short system message asks for
# the number alone (the chat template would add its own, longer default system turn otherwise) and
# no instruction is appended to the question.
TASK = {"task": "chain_sum", "options": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
        "system": "Answer with only the number.", "instruction": "", "n_train": 2000, "n_test": 380, "n_eval": 200}
QUICK_TASK = {"n_train": 64, "n_test": 40, "n_eval": 8}
# reasoning-gym draws entry i from seed + i, so --seed K and K + 1 would share all but one row;
# the demo's data seed is K * DATA_SEED_STRIDE (> n_train + n_test): disjoint draws per seed.
DATA_SEED_STRIDE = 10_000
QUICK_LAYERS = 2  # --quick trains a copy of the model cut to its first 2 decoder layers (the CI check)
QUICK_SFT = ["trainer.total_steps=2", "data.batch_size=4", "optim.micro_batch_size=4"]
QUICK_RL = ["trainer.total_steps=2", "data.train_batch_size=2", "rollout.n=4", "rollout.val_n=2",
            "trainer.pass_k=[1,2]", "rollout.max_response_length=8"]


def chain_sum_reward(prompt: str, response: str, ground_truth, extra_info=None, **extra) -> dict:
    """The built-in reasoning_gym reward (rewards/reasoning_gym.py), run inline in this process.
    chain_sum's scorer compares two numbers, so its time is bounded and it needs no worker process;
    on the loaded 2-core machine a reward worker's start-up (importing reasoning-gym) took over
    the pool's 120 s limit."""
    from reinforge.rewards.reasoning_gym import reasoning_gym_reward

    return reasoning_gym_reward(prompt, response, ground_truth, extra_info, **extra)


def _check_rows(rows: list[dict], path: str) -> None:
    from reinforge.rewards.reasoning_gym import check_rows

    check_rows(rows, path)


chain_sum_reward.bounded = True
chain_sum_reward.check_rows = _check_rows


class Clock:
    """Wall and process CPU seconds (user + system) of each stage, in stage order."""

    def __init__(self):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.t0, self.c0 = time.perf_counter(), self._cpu()

    @staticmethod
    def _cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def lap(self, stage: str) -> None:
        t, c = time.perf_counter(), self._cpu()
        self.wall[stage], self.cpu[stage] = t - self.t0, c - self.c0
        self.t0, self.c0 = t, c

    def totals(self) -> None:
        self.wall["total"], self.cpu["total"] = sum(self.wall.values()), sum(self.cpu.values())


def make_inputs(out: Path, quick: bool, seed: int) -> tuple[Path, dict, dict]:
    """(model folder, data paths {train, test, sft}, task settings). The SFT rows are the RL
    prompts with the task's answers (data/reasoning_gym.sft_rows); the held-out rows are the first
    n_eval test rows."""
    from reinforge.data.io import load_rows, write_rows
    from reinforge.data.reasoning_gym import make_reasoning_gym_data
    from reinforge.models.pretrained import pretrained_folder, truncated_copy

    task = {**TASK, **stage_seeds(seed), **(QUICK_TASK if quick else {})}
    model = pretrained_folder(MODEL, quiet=False)
    if quick:
        model = truncated_copy(model, out / "model_quick", layers=QUICK_LAYERS)
    paths = make_reasoning_gym_data(task["task"], str(out / "data"), n_train=task["n_train"], n_test=task["n_test"],
                                    seed=task["data_seed"] * DATA_SEED_STRIDE, instruction=task["instruction"],
                                    system=task["system"], options=task["options"])
    test = load_rows(paths["test"])
    if len(test) < task["n_eval"]:
        raise SystemExit(f"reinforge demo: {len(test)} held-out prompts after dropping those in train, "
                         f"fewer than {task['n_eval']}")
    paths["test"] = write_rows(test[:task["n_eval"]], str(out / "data" / "test.parquet"))
    # paths["sft"]: the data module's chat SFT rows (the train prompts answered with the gold; no
    # instruction here, so the answer alone), the same pairs the demo used to write beside it.
    return Path(model), paths, task


def rl_overrides(model: Path, paths: dict, run_dir: Path, seed: int) -> list[str]:
    return [f"model.path={model}", f"data.train_files=[{paths['train']}]", f"data.val_files=[{paths['test']}]",
            f"trainer.run_dir={run_dir}", *trainer_seeds(seed)]


def evaluate(model: Path, paths: dict, out: Path, seed: int, extra: list[str]) -> dict:
    """Greedy, sampled mean@n and pass@k of `model` on the held-out prompts: the GRPO preset's
    validation, nothing trained."""
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    cfg = load_config(RLConfig, "demo_chain_sum_grpo",
                      rl_overrides(model, paths, out / "base_eval", seed) + ["trainer.val_sampled=always"] + extra)
    trainer = RLTrainer(cfg)
    try:
        return val_metrics(trainer.validate())
    finally:
        trainer.close()


def run_sft(model: Path, out: Path, paths: dict, seed: int, extra: list[str]) -> Path:
    """SFT of the pretrained model on the task's answers in out/sft; returns out/sft/hf."""
    from reinforge.config.load import load_config
    from reinforge.config.sft import SFTConfig
    from reinforge.trainers.sft import SFTTrainer

    overrides = [f"model.path={model}", f"data.train_files=[{paths['sft']}]", f"trainer.run_dir={out / 'sft'}",
                 *trainer_seeds(seed)]
    SFTTrainer(load_config(SFTConfig, "demo_chain_sum_sft", overrides + extra)).fit(overwrite=True)
    return out / "sft" / "hf"


def run_grpo(model: Path, out: Path, paths: dict, seed: int, extra: list[str]) -> tuple[dict, dict]:
    """GRPO from `model` in out/grpo -> (validation at step 0 = the SFT policy, final validation)."""
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    run_dir = out / "grpo"
    cfg = load_config(RLConfig, "demo_chain_sum_grpo", rl_overrides(model, paths, run_dir, seed) + extra)
    final = RLTrainer(cfg).fit(overwrite=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return val_metrics(next(r for r in rows if r["step"] == 0)), val_metrics(final)


def format_table(report: dict) -> str:
    cols = {"base": report["base"], "after SFT": report["sft"], "after GRPO": report["rl"]}
    keys = ["acc_greedy", "acc_sampled"] + sorted(k for k in report["base"] if k.startswith("pass@"))
    lines = [f"{'held-out':<16}" + "".join(f"{c:>12}" for c in cols) + f"{'gain':>10}"]
    for k in keys:
        vals = [m.get(k) for m in cols.values()]
        cells = "".join(f"{v:>12.3f}" if v is not None else f"{'-':>12}" for v in vals)
        gain = f"{vals[2] - vals[0]:>+10.3f}" if vals[0] is not None and vals[2] is not None else ""
        lines.append(f"{k:<16}{cells}{gain}")
    lines += ["", f"{'time':<16}{'wall s':>10}{'CPU s':>10}"]
    wall, cpu = report["wall_s"], report["cpu_s"]
    lines += [f"{stage:<16}{wall[stage]:>10.1f}{cpu[stage]:>10.1f}" for stage in wall]
    return "\n".join(lines)


def run_chain_sum_demo(args, threads: int) -> int:
    out = Path(args.out or ("runs/demo_chain_sum" if args.seed == 0 else f"runs/demo_chain_sum_seed{args.seed}"))
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock()
    model, paths, task = make_inputs(out, args.quick, args.seed)
    clock.lap("model+data")
    base = evaluate(model, paths, out, args.seed, QUICK_RL if args.quick else [])
    clock.lap("eval base")
    sft_model = run_sft(model, out, paths, args.seed, QUICK_SFT if args.quick else [])
    clock.lap("sft")
    after_sft, final = run_grpo(sft_model, out, paths, args.seed, QUICK_RL if args.quick else [])
    clock.lap("grpo (+evals)")
    clock.totals()
    report = {"model": MODEL, "task": task, "seed": args.seed, "quick": args.quick, "torch_threads": threads,
              "base": base, "sft": after_sft, "rl": final, "wall_s": clock.wall, "cpu_s": clock.cpu,
              "base_model": str(model), "sft_model": str(sft_model), "rl_run_dir": str(out / "grpo"),
              "rl_model": str(out / "grpo" / "hf")}
    report["delta_acc_greedy"] = final["acc_greedy"] - base["acc_greedy"]
    (out / "demo_report.json").write_text(json.dumps(report, indent=2))
    print("\n" + format_table(report))
    print(f"\nheld-out greedy accuracy (seed {args.seed}, {MODEL}): base {base['acc_greedy']:.1%} -> SFT "
          f"{after_sft['acc_greedy']:.1%} -> GRPO {final['acc_greedy']:.1%} "
          f"({report['delta_acc_greedy'] * 100:+.1f} points), {clock.cpu['total']:.0f} CPU s, "
          f"{clock.wall['total']:.0f} wall s")
    print(f"run directory: {out}  (RL run: {out / 'grpo'}, report: {out / 'grpo' / 'report'}, "
          f"summary: {out / 'demo_report.json'})")
    return 0
