"""reinforge vs TRL's GRPOTrainer, side by side on one CPU: tokens/s, seconds per stage, ratio.

    make trl-venv                       # TRL 1.16 in .venv-trl (once)
    python benchmarks/vs_trl.py [--sizes tiny small] [--kl 0 1] [--precision fp32 bf16] [--rounds 3]
                                [--steps 6] [--threads 1] [--attn sdpa]

Both sides get the same model folder (`reinforge model --out`: tiny = 3M parameters, <= 32
response tokens; small = hidden 512 x 8 layers, 15.0M, <= 128 tokens), the same arithmetic
prompts, 4 prompts x 8 samples per optimizer step (one step per batch, one epoch), the same lr,
precision and attention kernel, sampling at temperature 1 from the full softmax, EOS suppressed on both sides
(reinforge `rollout.ignore_eos`, TRL `min_new_tokens`), so every response is exactly the
maximum length, tokens per step are equal and the tokens/s ratio is the step-time ratio. With
KL: reinforge GRPO's `actor.use_kl_loss` (k3, coef 0.04) against TRL's `beta=0.04`; without:
no reference model on either side. Precision fp32: both sides fp32; bf16: reinforge
`model.autocast=bf16`, TRL `bf16=True` (its default: autocast). Each cell alternates TRL and reinforge runs
(`--rounds` each, one process per run, warm-up step dropped) and reports the median step
of each run; the ratio is per round, so a load change on the machine hits both sides of it.

`--side reinforge ...` is the reinforge half (one process per run, prints JSON); the TRL half
is benchmarks/trl_side.py, run with .venv-trl's Python.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRL_PY = ROOT / ".venv-trl" / "bin" / "python"
SIZES = {"tiny": dict(hidden=None, layers=None, tokens=32), "small": dict(hidden=512, layers=8, tokens=128)}
BETA, LR, PROMPTS, N = 0.04, 1e-5, 4, 8
STAGES = ("gen", "reward", "old_log_prob", "ref", "update")


def reinforge_side(args) -> dict:
    """Steps of reinforge's GRPO trainer on the benchmark's settings -> per-step stage seconds."""
    import torch

    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig, RolloutConfig
    from reinforge.data.io import load_rows
    from reinforge.models.loading import load_tokenizer
    from reinforge.trainers.rl import RLTrainer

    tok = load_tokenizer(args.model)
    longest = max(len(tok(r["prompt"])["input_ids"]) for r in load_rows(args.train))
    over = [f"model.path={args.model}", f"data.train_files=[{args.train}]", f"data.max_prompt_length={longest}",
            f"rollout.max_response_length={args.max_tokens}", f"data.train_batch_size={PROMPTS}", f"rollout.n={N}",
            f"actor.lr={LR}", f"actor.use_kl_loss={bool(args.kl[0])}", f"actor.kl_loss_coef={BETA}",
            f"trainer.total_steps={args.steps}", f"trainer.run_dir={tempfile.mkdtemp(prefix='vs_trl_')}",
            "trainer.loggers=[]", "trainer.progress=false", "trainer.report=false",
            "reward.functions=[{name: arithmetic}]", *args.override]
    if "ignore_eos" in RolloutConfig.__dataclass_fields__:
        over.append("rollout.ignore_eos=true")
    trainer = RLTrainer(load_config(RLConfig, "grpo", over))
    steps = []
    for _ in range(args.steps):
        trainer.step_idx += 1
        t0 = time.perf_counter()
        m = trainer.step()
        total = time.perf_counter() - t0
        t = {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/")}
        steps.append({"step": total, "gen": t.get("gen", 0.0), "reward": t.get("reward", 0.0),
                      "old_log_prob": t.get("old_log_prob", 0.0), "ref": t.get("ref", 0.0),
                      "update": t.get("update_actor", 0.0), "tokens": m["response_length/mean"] * PROMPTS * N,
                      **{k: v for k, v in m.items() if k.startswith("perf/")}})
    trainer.close()
    return {"steps": steps, "threads": torch.get_num_threads()}


def run_side(side: str, model: str, train: str, tokens: int, kl: int, steps: int, threads: int,
             precision: str, attn: str, override: list[str]) -> dict:
    """One run of one side in its own process -> its JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if side == "trl":
        cmd = [str(TRL_PY), str(ROOT / "benchmarks" / "trl_side.py"), "--beta", str(BETA if kl else 0.0),
               "--lr", str(LR), "--prompts", str(PROMPTS), "--n", str(N), "--bf16", str(int(precision == "bf16")),
               "--attn", attn]
    else:
        override = [f"model.autocast={'bf16' if precision == 'bf16' else 'none'}",
                    f"model.attn_implementation={attn}", *override]
        cmd = [sys.executable, __file__, "--side", "reinforge", "--kl", str(kl),
               *[a for o in override for a in ("--override", o)]]
    cmd += ["--model", model, "--train", train, "--steps", str(steps), "--max-tokens", str(tokens)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{side} run failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(run: dict) -> dict:
    """Medians over the steps after the warm-up step: seconds per stage, tokens/s."""
    steps = run["steps"][1:]
    med = {k: statistics.median(s.get(k, 0.0) for s in steps) for k in ("step", *STAGES, "tokens")}
    med["tok_s"] = statistics.median(s["tokens"] / s["step"] for s in steps)
    for k in steps[0]:
        if k.startswith("perf/"):
            med[k] = statistics.median(s[k] for s in steps)
    return med


def make_model(out: Path, size: str) -> str:
    spec = SIZES[size]
    cmd = [str(Path(sys.executable).parent / "reinforge"), "model", "--out", str(out / size)]
    if spec["hidden"]:
        cmd += ["--hidden", str(spec["hidden"]), "--layers", str(spec["layers"])]
    subprocess.run(cmd, check=True, capture_output=True)
    return str(out / size)


def fmt(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
    ap.add_argument("--kl", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="measured steps per run (after one warm-up)")
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention kernel, both sides")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS for both sides (0: torch's default; 1 is fastest on a busy 2-core machine)")
    ap.add_argument("--override", action="append", default=[], help="extra reinforge config override")
    ap.add_argument("--side", choices=["reinforge"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--train", help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        json.dump(reinforge_side(args), sys.stdout)
        print()
        return
    if not TRL_PY.exists():
        raise SystemExit(f"{TRL_PY} not found: build TRL's venv first with `make trl-venv`")
    from reinforge.tasks import make_task_data

    work = Path(tempfile.mkdtemp(prefix="vs_trl_"))
    n_train = PROMPTS * (args.steps + 1) * 4
    train = make_task_data("arithmetic", str(work / "data"), n_train=n_train, n_test=8, n_sft=8, seed=0)["train"]
    print(f"reinforge vs TRL 1.16 GRPOTrainer: {PROMPTS} prompts x {N} samples, one optimizer step per batch, "
          f"EOS suppressed, medians of {args.steps} steps after 1 warm-up, {args.rounds} alternating rounds, "
          f"threads={args.threads or 'default'}, attention {args.attn}"
          f"{', overrides ' + ' '.join(args.override) if args.override else ''}")
    print("\n| model | KL | precision | round | TRL s/step | reinforge s/step | TRL tok/s | reinforge tok/s | ratio | "
          "reinforge gen / old_lp / ref / update s | TRL gen / ref / update s | perf/mfu |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        model = make_model(work, size)
        tokens = SIZES[size]["tokens"]
        for kl, precision in [(k, p) for k in args.kl for p in args.precision]:
            ratios = []
            for r in range(args.rounds):
                runs = {}
                for side in (("trl", "reinforge") if r % 2 == 0 else ("reinforge", "trl")):
                    runs[side] = summary(run_side(side, model, train, tokens, kl, args.steps + 1, args.threads,
                                                  precision, args.attn, args.override))
                t, f = runs["trl"], runs["reinforge"]
                ratio = f["tok_s"] / t["tok_s"]
                ratios.append(ratio)
                print(f"| {size} | {'yes' if kl else 'no'} | {precision} | {r + 1} | {fmt(t['step'])} | {fmt(f['step'])} | "
                      f"{t['tok_s']:.0f} | {f['tok_s']:.0f} | {ratio:.2f}x | "
                      f"{fmt(f['gen'])} / {fmt(f['old_log_prob'])} / {fmt(f['ref'])} / {fmt(f['update'])} | "
                      f"{fmt(t['gen'])} / {fmt(t['ref'])} / {fmt(t['update'])} | {f.get('perf/mfu', float('nan')):.3f} |",
                      flush=True)
            print(f"| {size} | {'yes' if kl else 'no'} | {precision} | all | | | | | {min(ratios):.2f}-{max(ratios):.2f}x "
                  f"(median {statistics.median(ratios):.2f}x) | | | |", flush=True)


if __name__ == "__main__":
    main()
