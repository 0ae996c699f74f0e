"""Study 1 on long_addition: symmetric clip (0.2/0.2) vs clip-higher (0.2/0.28), 3 seeds each:
policy entropy over training (DAPO's claim: a higher upper clip lets low-probability tokens grow,
so entropy collapses less).

`python benchmarks/studies/long_clip_higher.py [--steps 40 --seeds 0,1,2 --jobs 2]`; writes
benchmarks/studies/out/long_clip_higher/{entropy.png, clipfrac.png, summary.md}. Several
updates per batch (2 epochs x 4 mini-batches) take the policy off its sampling distribution so
the clip binds; actor/pg_clipfrac counts tokens clipped at either bound (ppo_clip).
"""
from __future__ import annotations

from long_common import band_plot, cell, parse, run_arms, table, val, window

ARMS = {"symmetric 0.2/0.2": ["actor.clip_high=0.2"], "clip-higher 0.2/0.28": ["actor.clip_high=0.28"]}
SHARED = ["actor.lr=5e-5", "actor.ppo_epochs=2", "actor.mini_batch_size=16", "actor.loss_agg_mode=token-mean",
          "actor.use_kl_loss=false"]


def main() -> None:
    args, out = parse("long_clip_higher", steps=40)
    arms = run_arms(out.name, {n: ("grpo", SHARED + o) for n, o in ARMS.items()}, args)
    band_plot(arms, "actor/entropy", "Policy entropy: symmetric clip vs clip-higher", "entropy (nats / token)",
              out / "entropy.png")
    band_plot(arms, "actor/pg_clipfrac", "Clip fraction (either bound, pg_clipfrac)", "fraction of tokens",
              out / "clipfrac.png")
    rows = [[n, cell([window(r, "actor/entropy", first=5) for r in runs]),
             cell([window(r, "actor/entropy", last=5) for r in runs]), cell([window(r, "actor/pg_clipfrac") for r in runs]),
             cell([window(r, "reward/acc", last=5) for r in runs]), cell([val(r, 0) for r in runs]),
             cell([val(r) for r in runs])] for n, runs in arms.items()]
    md = table(["arm", "entropy first 5 steps", "entropy last 5 steps", "mean clipfrac", "train acc last 5",
                "greedy acc base", "greedy acc final"], rows)
    (out / "summary.md").write_text(f"{len(args.seeds)} seeds, {args.steps} steps; mean [min, max] over seeds.\n\n{md}\n")
    print(md)


if __name__ == "__main__":
    main()
