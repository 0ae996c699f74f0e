"""Synchronous vs asynchronous rollout (`rollout.staleness=1`) on the demo task's shape, side by side.

    python benchmarks/async_rollout.py                  # step-time table (a few minutes)
    python benchmarks/async_rollout.py --learn --seeds 0 1   # held-out greedy after the demo's RL
    python benchmarks/async_rollout.py --ray            # the Ray table: sync, staleness 1, + partial
    python benchmarks/async_rollout.py --learn --ray    # 1 trainer rank + 1 rollout worker vs Ray sync

Timing: the demo's GRPO stage (presets/demo_grpo.yaml: 32 prompts x 8 samples, 5-token
responses, the demo's ~3M-parameter Qwen2) from a random model, `rollout.ignore_eos=true` so
every step does the same work. Each setting runs `--steps` steps (the first `--warmup` not
counted), the settings take turns `--rounds` times in this one process so that load from other
jobs hits them alike, and the table shows medians per step: wall time, generation (the
producer's generate() seconds when asynchronous; `wait` is what the trainer waited for it),
the old-log-prob pass and the actor update. Overlap works when async's step < gen + update.

Learning (`--learn`): `reinforge demo`'s data, model and SFT base for each seed (cached under
--root), then its GRPO stage (120 steps) synchronous and with staleness 1, at equal samples;
prints held-out greedy / sampled accuracy at the end of each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SETTINGS = {  # name -> (torch intra-op threads, overrides); async: the producer thread runs one more
    "sync, 1 thread": (1, ["rollout.staleness=0"]),
    "staleness 1, 1+1 threads": (1, ["rollout.staleness=1"]),
}
# Two intra-op threads for the synchronous loop: fair on an idle 2-core machine, but on a busy
# one they spin-wait on each other (37-56 s a step here where one thread took ~9 s), so opt-in.
TWO_THREADS = {"sync, 2 threads": (2, ["rollout.staleness=0"])}
# trainer.backend=ray on 2 CPU processes: the synchronous Ray run generates on its one rank; the
# asynchronous ones have 1 trainer rank + 1 rollout-worker actor (distributed/rollout_workers.py);
# with partial rollouts the worker also takes new weights mid-generation (distributed/partial.py).
RAY_SETTINGS = {
    "ray sync, 1 rank": (1, ["trainer.backend=ray", "rollout.staleness=0"]),
    "ray staleness 1, 1 rank+1 wkr": (1, ["trainer.backend=ray", "rollout.staleness=1", "trainer.rollout_workers=1"]),
    "ray staleness 1 + partial": (1, ["trainer.backend=ray", "rollout.staleness=1", "trainer.rollout_workers=1",
                                      "rollout.partial=true"]),
}
QUIET = ["trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.report=false"]


def demo_inputs(root: Path, seed: int, quick: bool = False) -> tuple[dict, Path]:
    """The demo's task data, tiny model and SFT base for `seed`, built once under `root`."""
    from reinforge.cli.demo import make_inputs, run_sft

    base_dir = root / f"demo_s{seed}"
    paths, _ = make_inputs(base_dir, quick, seed)
    if not (base_dir / "sft" / "hf" / "config.json").exists():
        run_sft(base_dir, paths, seed, QUIET)
    return paths, base_dir / "sft" / "hf"


def timed_steps(model: Path, paths: dict, run_dir: Path, threads: int, overrides: list[str], steps: int) -> list[dict]:
    """One RL run of `steps` steps on the demo's settings -> its per-step metrics rows."""
    import torch

    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    torch.set_num_threads(threads)
    cfg = load_config(RLConfig, "demo_grpo", [
        f"model.path={model}", f"data.train_files=[{paths['train']}]", f"trainer.run_dir={run_dir}",
        f"trainer.total_steps={steps}", "trainer.val_before_train=false", "trainer.val_every=0",
        "trainer.export_hf=false", "rollout.ignore_eos=true", *QUIET, *overrides])
    RLTrainer(cfg).fit(overwrite=True)
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step": 0' not in x]


def timing_table(rows: dict[str, list[dict]]) -> str:
    cols = [("step", "timing_s/step"), ("gen", None), ("wait", "timing_s/gen"),
            ("old_logp", "timing_s/old_log_prob"), ("update", "timing_s/update_actor")]
    out = [f"{'setting':<32}" + "".join(f"{c:>10}" for c, _ in cols) + f"{'gen+update':>12}{'overlap':>9}{'steps':>7}"]
    for name, rs in rows.items():
        async_ = "timing_s/gen_producer" in rs[0]
        med = {}
        for c, key in cols:
            key = key or ("timing_s/gen_producer" if async_ else "timing_s/gen")
            vals = [r.get(key, 0.0) for r in rs]
            med[c] = statistics.median(vals)
        if not async_:
            med["wait"] = float("nan")
        # overlap: the share of the shorter of generation and update hidden behind the other
        # (1: step = max(gen, update); 0: step = gen + update; synchronous: not defined)
        ov = (med["gen"] + med["update"] - med["step"]) / max(min(med["gen"], med["update"]), 1e-9) if async_ \
            else float("nan")
        out.append(f"{name:<32}" + "".join(f"{med[c]:>10.3f}" for c, _ in cols)
                   + f"{med['gen'] + med['update']:>12.3f}{ov:>9.2f}{len(rs):>7}")
    return "\n".join(out)


def bench(args) -> None:
    from reinforge.cli.demo import make_inputs

    root = Path(args.root) / "timing"
    paths, _ = make_inputs(root, False, 0)  # random init: the demo's model before SFT
    settings = RAY_SETTINGS if args.ray else {**SETTINGS, **(TWO_THREADS if args.two_threads else {})}
    if args.ray:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # once: ~10 s
    rows: dict[str, list[dict]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, (threads, overrides) in settings.items():
            got = timed_steps(root / "model", paths, root / "run", threads, overrides, args.steps)
            rows[name] += got[args.warmup:]
    print(timing_table(rows))


def _overlap_parts(n_prompts: int = 32, n: int = 8):
    """The demo's model, a LeanRollout on it and its prompts (demo task shape)."""
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer
    from reinforge.trainers.validation import prompts_batch
    from reinforge.workers.rollout.lean import LeanRollout

    tok = build_char_tokenizer()
    model = make_tiny_model(tok, seed=0)
    rollout = LeanRollout(model, tok, max_prompt_length=8, max_response_length=5, ignore_eos=True)
    items = [{"prompt_ids": tok(f"{i}+{i}=")["input_ids"], "prompt_text": "", "ground_truth": ""} for i in range(n_prompts)]
    return model, rollout, prompts_batch(items, 0), n


def _gen_job(iters: int):
    """Set up, then return the timed part: `iters` rollouts of the demo's shape."""
    import torch

    torch.set_num_threads(1)
    _, rollout, prompts, n = _overlap_parts()
    return lambda: [rollout.generate(prompts, n=n) for _ in range(iters)]


def _update_job(iters: int):
    """Set up, then return the timed part: `iters` forward + backward + AdamW steps on a rollout batch."""
    import torch

    from reinforge.models.forward import response_logprobs

    torch.set_num_threads(1)
    model, rollout, prompts, n = _overlap_parts()
    batch = rollout.generate(prompts, n=n)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def run():
        for _ in range(iters):
            logp, _ = response_logprobs(model, batch["input_ids"], batch["attention_mask"], 5)
            logp.sum().backward()
            opt.step()
            opt.zero_grad()
    return run


def _worker(job, iters: int, barrier) -> None:
    run = job(iters)
    barrier.wait()  # timing starts when both workers are set up
    run()


def overlap(args) -> None:
    """Generation and an update loop of the demo's shape, one after the other, in two threads of one
    process (as the producer does) and in two processes: wall seconds of the work (set-up, and a
    process's start, not counted), medians of --rounds."""
    import multiprocessing
    import threading

    def concurrent(start, make_barrier):
        barrier = make_barrier(3)
        workers = [start(_gen_job, args.gen_iters, barrier), start(_update_job, args.steps, barrier)]
        barrier.wait()
        t0 = time.perf_counter()
        [w.join() for w in workers]
        return time.perf_counter() - t0

    def thread(job, iters, barrier):
        t = threading.Thread(target=_worker, args=(job, iters, barrier))
        t.start()
        return t

    ctx = multiprocessing.get_context("spawn")

    def process(job, iters, barrier):
        p = ctx.Process(target=_worker, args=(job, iters, barrier))
        p.start()
        return p

    def sequential():
        gen, update = _gen_job(args.gen_iters), _update_job(args.steps)
        t0 = time.perf_counter()
        gen()
        update()
        return time.perf_counter() - t0

    times = {"sequential": [], "2 threads": [], "2 processes": []}
    runs = (sequential, lambda: concurrent(thread, threading.Barrier), lambda: concurrent(process, ctx.Barrier))
    for _ in range(args.rounds):
        for name, fn in zip(times, runs):
            times[name].append(fn())
    for name, ts in times.items():
        print(f"{name:<14}{statistics.median(ts):>8.2f} s  ({', '.join(f'{t:.2f}' for t in ts)})")


def learn(args) -> None:
    import torch

    from reinforge.cli.demo import run_rl

    torch.set_num_threads(1)  # as the demo
    extra = [*QUIET, "trainer.val_every=40", "trainer.val_sampled=end"]
    print(f"{'seed':<6}{'setting':<14}{'greedy base':>12}{'greedy RL':>11}{'sampled RL':>12}{'RL s':>8}")
    for seed in args.seeds:
        paths, base = demo_inputs(Path(args.root), seed)
        ray = ["trainer.backend=ray", "trainer.rollout_workers=1"] if args.ray else []
        for name, k in (("sync", 0), ("staleness 1", 1)):
            t0 = time.perf_counter()
            before, final = run_rl(Path(args.root) / f"learn_s{seed}_k{k}{'_ray' if ray else ''}", base, paths, seed,
                                   [*extra, f"rollout.staleness={k}", *ray])
            secs = time.perf_counter() - t0
            print(f"{seed:<6}{name:<14}{before['val/acc_greedy']:>12.3f}{final['val/acc_greedy']:>11.3f}"
                  f"{final['val/acc_sampled']:>12.3f}{secs:>8.0f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/tmp/reinforge_async_bench", help="data, models and runs (cached)")
    ap.add_argument("--steps", type=int, default=8, help="steps per run (timing)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of each run not counted")
    ap.add_argument("--rounds", type=int, default=2, help="times each setting runs, taking turns")
    ap.add_argument("--two-threads", action="store_true", help="also time the synchronous loop on 2 threads")
    ap.add_argument("--ray", action="store_true", help="the trainer.backend=ray table (2 CPU processes)")
    ap.add_argument("--learn", action="store_true", help="the learning check instead of timing")
    ap.add_argument("--overlap", action="store_true", help="thread vs process overlap of generation and update")
    ap.add_argument("--gen-iters", type=int, default=8, help="generation rounds (--overlap)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    args = ap.parse_args()
    learn(args) if args.learn else overlap(args) if args.overlap else bench(args)


if __name__ == "__main__":
    main()
