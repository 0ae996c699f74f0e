"""Learning against TRL on the real model: SmolLM2-135M-Instruct trained with GRPO on reasoning-gym
chain_sum by reinforge and by TRL's GRPOTrainer from the same seed at equal samples, then scored
by one evaluator.

    make trl-venv                      # TRL 1.16 + reasoning-gym in .venv-trl (or REINFORGE_TRL_PYTHON=...)
    python benchmarks/vs_trl_learning.py [--seeds 0 1] [--steps 8] [--prompts 4] [--n 8] [--tokens 32]
                                         [--n-test 200] [--threads 1] [--sequential]
                                         [--set actor.use_kl_loss=false ...]

Per seed: `reinforge data reasoning-gym chain_sum` (2-3 terms of 1-2 digits) with that seed,
steps x prompts training prompts (each side sees every prompt once: equal samples, steps x
prompts x n responses) and n_test held-out ones. Each side trains in its own process at its
documented settings, the shared knobs equal (lr 1e-5 = the grpo preset's, n samples per
prompt, `prompts` prompts per optimizer step, one optimizer step per batch, max new tokens,
temperature 1, EOS allowed, the seed):

- reinforge: `reinforge train --config grpo` (the preset: GRPO advantages, ppo_clip 0.2,
  seq-mean-token-mean, k3 KL loss coef 0.001, lr 1e-5) with the task's keys only; precision,
  decode dtype, checkpointing and micro-batch are the run plan's `auto` choices;
- TRL: GRPOTrainer with GRPOConfig's defaults (its loss, beta, precision, checkpointing,
  scheduler) and the shared knobs; reward: reinforge's extraction rule and the task's own
  scorer, restated in benchmarks/trl_side.py.

Each side exports its trained model (reinforge `run_dir/hf`, TRL `save_model`), and both, with
the untrained model, are scored by the same `reinforge eval` (greedy, the same prompt and
response limits) on the held-out prompts; the untrained model's evaluation runs during the
training, the two trained models' at the same time after it. CPU seconds are the training process's user + system
time (its reaped children included: reinforge's reward workers), read by /usr/bin/time -v, so
they count model loading on both sides. By default the two sides train at the same time (each
on `--threads` threads; CPU seconds do not depend on it, wall time halves); `--sequential` runs
them one after the other.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from vs_trl import RG_OPTIONS, TRL_PY  # noqa: E402

MODEL = "smollm2-135m-instruct"
TASK = "chain_sum"
LR = 1e-5


def _time_v(stderr: str) -> dict:
    """User + system CPU seconds, wall seconds and peak RSS (GB) from /usr/bin/time -v's report."""
    out = {}
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith(("User time (seconds)", "System time (seconds)")):
            out["cpu_s"] = out.get("cpu_s", 0.0) + float(line.rsplit(":", 1)[1])
        elif line.startswith("Elapsed (wall clock) time"):  # h:mm:ss or m:ss(.ss)
            parts = [float(x) for x in line.rsplit(": ", 1)[1].split(":")]
            out["wall_s"] = sum(x * 60 ** i for i, x in enumerate(reversed(parts)))
        elif line.startswith("Maximum resident set size"):
            out["peak_rss_gb"] = int(line.rsplit(":", 1)[1]) * 1024 / 1e9
    return out


def start(cmd: list[str], threads: int, log: Path) -> tuple[subprocess.Popen, float]:
    """`cmd` under /usr/bin/time -v, stdout + stderr to `log`; (process, start time)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    f = open(log, "w")
    return subprocess.Popen(["/usr/bin/time", "-v", *cmd], env=env, stdout=f, stderr=subprocess.STDOUT), time.time()


def finish(proc: subprocess.Popen, t0: float, log: Path, what: str) -> dict:
    """Wait for `proc`; its CPU seconds, peak RSS and wall seconds (a failure stops the benchmark)."""
    rc = proc.wait()
    text = log.read_text()
    if rc != 0:
        raise SystemExit(f"{what} failed (rc {rc}), log {log}:\n{text[-3000:]}")
    return {"wall_s": time.time() - t0, **_time_v(text)}  # the process's own wall time (not when it was reaped)


def reinforge_cmd(args, train: str, prompt_len: int, run_dir: Path, seed: int) -> list[str]:
    return [sys.executable, "-m", "reinforge.cli.main", "train", "--config", "grpo", f"model.path=pretrained:{MODEL}",
            f"data.train_files=[{train}]", "reward.functions=[{name: reasoning_gym}]",
            f"data.max_prompt_length={prompt_len}", f"rollout.max_response_length={args.tokens}",
            f"data.train_batch_size={args.prompts}", f"rollout.n={args.n}", f"trainer.total_steps={args.steps}",
            f"trainer.seed={seed}", f"trainer.run_dir={run_dir}", "trainer.loggers=[jsonl]",
            "trainer.progress=false", "trainer.report=false", *args.set]


def trl_cmd(args, model: str, train: str, out: Path, seed: int) -> list[str]:
    return [str(TRL_PY), str(ROOT / "benchmarks" / "trl_side.py"), "--model", model, "--train", train,
            "--steps", str(args.steps), "--prompts", str(args.prompts), "--n", str(args.n),
            "--max-tokens", str(args.tokens), "--lr", str(LR), "--seed", str(seed), "--reward", "reasoning_gym",
            "--ignore-eos", "0", "--defaults", "1", "--save", str(out)]


def eval_cmd(model: str, test: str, prompt_len: int, args) -> list[str]:
    """`reinforge eval` of `model` on the held-out file, greedy only (`--n 0`)."""
    return [sys.executable, "-m", "reinforge.cli.main", "eval", "--model", model, "--data", test, "--reward",
            "reasoning_gym", "--max-prompt-length", str(prompt_len), "--max-response-length", str(args.tokens),
            "--max-samples", str(args.n_test), "--n", "0"]


def eval_result(log: Path) -> dict:
    """The metrics JSON `reinforge eval` printed last (an indented object) in `log`."""
    text = "\n" + log.read_text()
    begin = text.rindex("\n{\n") + 1
    return json.loads(text[begin:text.index("\n}", begin) + 2])


def one_seed(args, work: Path, seed: int, model: str) -> dict:
    """Data, both trainings, the three evaluations of one seed -> the row of the table."""
    from reinforge.data.io import load_rows
    from reinforge.data.reasoning_gym import make_reasoning_gym_data
    from reinforge.data.text import render_prompt
    from reinforge.models.loading import load_tokenizer

    # the held-out questions are drawn first, every one kept; train asks none of them (data/reasoning_gym.py)
    d = make_reasoning_gym_data(TASK, str(work / f"data{seed}"), n_train=args.steps * args.prompts,
                                n_test=args.n_test, seed=seed, options=RG_OPTIONS)
    tok = load_tokenizer(model)
    prompt_len = max(len(tok(render_prompt(r["prompt"], tok, path, i, "prompt"))["input_ids"])
                     for path in (d["train"], d["test"]) for i, r in enumerate(load_rows(path)))
    run_dir, trl_out = work / f"reinforge{seed}", work / f"trl{seed}"
    jobs = {"trl": trl_cmd(args, model, d["train"], trl_out, seed),
            "reinforge": reinforge_cmd(args, d["train"], prompt_len, run_dir, seed)}
    log = {name: work / f"{name}{seed}.log" for name in ("trl", "reinforge", "eval_base", "eval_trl", "eval_reinforge")}
    base = start(eval_cmd(model, d["test"], prompt_len, args), args.eval_threads, log["eval_base"])  # meanwhile
    res = {}
    if args.sequential:
        for side, cmd in jobs.items():
            res[side] = finish(*start(cmd, args.threads, log[side]), log[side], side)
    else:
        procs = {side: start(cmd, args.threads, log[side]) for side, cmd in jobs.items()}
        res = {side: finish(*p, log[side], side) for side, p in procs.items()}
    print(f"seed {seed}: trained (CPU s: TRL {res['trl']['cpu_s']:.0f}, reinforge {res['reinforge']['cpu_s']:.0f})",
          flush=True)
    derived = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else ""
    res["reinforge"]["derived"] = derived[derived.find("derived:"):] if "derived:" in derived else ""
    evals = {"base": base, **{name: start(eval_cmd(path, d["test"], prompt_len, args), args.eval_threads,
                                           log[f"eval_{name}"])
                              for name, path in (("trl", str(trl_out)), ("reinforge", str(run_dir / "hf")))}}
    for name, p in evals.items():  # the three evaluations run at once (one evaluator, three models)
        finish(*p, log[f"eval_{name}"], f"eval {name}")
        res.setdefault(name, {})["acc"] = eval_result(log[f"eval_{name}"])["val/acc_greedy"]
        res[name]["n_test"] = min(args.n_test, len(load_rows(d["test"])))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps (one batch each)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--tokens", type=int, default=32, help="max new tokens, training and evaluation")
    ap.add_argument("--n-test", type=int, default=200, help="held-out prompts")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each training process")
    ap.add_argument("--eval-threads", type=int, default=1)
    ap.add_argument("--sequential", action="store_true", help="train one side after the other")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra keys for reinforge's run, e.g. actor.use_kl_loss=false (TRL's default beta=0)")
    args = ap.parse_args()
    if not TRL_PY.exists():
        raise SystemExit(f"{TRL_PY} not found: build TRL's venv first with `make trl-venv`")
    from reinforge.models.pretrained import pretrained_folder

    model = str(pretrained_folder(MODEL))
    work = Path(tempfile.mkdtemp(prefix="vs_trl_learning_"))
    print(f"SmolLM2-135M-Instruct, reasoning-gym {TASK} {RG_OPTIONS}: {args.steps} steps x {args.prompts} prompts x "
          f"{args.n} samples, <= {args.tokens} new tokens, lr {LR}, {args.threads} thread(s) per training process"
          f"{', sequential' if args.sequential else ', both sides at once'}"
          f"{'; reinforge keys ' + ' '.join(args.set) if args.set else ''}; greedy held-out accuracy on "
          f"{args.n_test} prompts by `reinforge eval`; work dir {work}; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    rows = {}
    for seed in args.seeds:
        rows[seed] = one_seed(args, work, seed, model)
        r = rows[seed]
        print(f"seed {seed}: base {r['base']['acc']:.3f}, TRL {r['trl']['acc']:.3f}, reinforge "
              f"{r['reinforge']['acc']:.3f}; reinforge plan: {r['reinforge']['derived']!r}", flush=True)
    print("\n| seed | held-out prompts | base acc | TRL acc | reinforge acc | TRL CPU s | reinforge CPU s | "
          "CPU ratio | "
          "TRL wall s | reinforge wall s | peak RSS TRL / reinforge GB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for seed, r in rows.items():
        t, f = r["trl"], r["reinforge"]
        print(f"| {seed} | {r['base']['n_test']} | {r['base']['acc']:.3f} | {t['acc']:.3f} | {f['acc']:.3f} | "
              f"{t['cpu_s']:.0f} | "
              f"{f['cpu_s']:.0f} | {f['cpu_s'] / t['cpu_s']:.2f}x | {t['wall_s']:.0f} | {f['wall_s']:.0f} | "
              f"{t.get('peak_rss_gb', float('nan')):.2f} / {f.get('peak_rss_gb', float('nan')):.2f} |")
    ok = all(r["reinforge"]["acc"] >= r["trl"]["acc"] and r["reinforge"]["cpu_s"] <= 0.5 * r["trl"]["cpu_s"]
             for r in rows.values())
    print(f"\ngoal (reinforge accuracy >= TRL's at <= 0.5x its CPU seconds, every seed): {'met' if ok else 'not met'}")


if __name__ == "__main__":
    main()
