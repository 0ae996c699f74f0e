"""Study 2 on long_addition: seq-mean-token-mean (GRPO) vs token-mean (DAPO) vs Dr.GRPO
(seq-mean-token-sum-norm, no std normalisation), 3 seeds each: length of incorrect responses
over training (Dr.GRPO's claim: dividing each sequence's loss by its own length |o_i| penalises
long wrong answers less per token, so they grow).

`python benchmarks/studies/long_loss_agg.py [--steps 30 --seeds 0,1,2 --jobs 2]`; writes
benchmarks/studies/out/long_loss_agg/{incorrect_length.png, correct_length.png, summary.md}.
"""
from __future__ import annotations

from long_common import band_plot, cell, parse, run_arms, table, val, window

ARMS = {
    "seq-mean-token-mean (GRPO)": ("grpo", ["actor.loss_agg_mode=seq-mean-token-mean"]),
    "token-mean (DAPO)": ("grpo", ["actor.loss_agg_mode=token-mean"]),
    "Dr.GRPO": ("drgrpo", []),
}
SHARED = ["actor.lr=5e-5", "actor.use_kl_loss=false"]


def main() -> None:
    args, out = parse("long_loss_agg", steps=30)
    arms = run_arms(out.name, {n: (p, SHARED + o) for n, (p, o) in ARMS.items()}, args)
    band_plot(arms, "response_length/incorrect_mean", "Length of incorrect responses", "tokens",
              out / "incorrect_length.png")
    band_plot(arms, "response_length/correct_mean", "Length of correct responses", "tokens", out / "correct_length.png")
    rows = [[n, cell([window(r, "response_length/incorrect_mean", first=5) for r in runs]),
             cell([window(r, "response_length/incorrect_mean", last=5) for r in runs]),
             cell([window(r, "response_length/correct_mean", last=5) for r in runs]),
             cell([window(r, "reward/acc", last=5) for r in runs]), cell([val(r) for r in runs])]
            for n, runs in arms.items()]
    md = table(["arm", "incorrect len first 5", "incorrect len last 5", "correct len last 5", "train acc last 5",
                "greedy acc final"], rows)
    (out / "summary.md").write_text(f"{len(args.seeds)} seeds, {args.steps} steps; mean [min, max] over seeds.\n\n{md}\n")
    print(md)


if __name__ == "__main__":
    main()
