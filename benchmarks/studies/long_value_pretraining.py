"""Study 3 on long_addition: PPO with and without value pretraining, and each of VAPO's two GAE
changes on top of pretraining, 3 seeds each: correlation of advantage with token position, and
response length over training.

VAPO's claim (arXiv:2504.05118): a critic initialised from the policy is biased, so early tokens
get systematically different advantages than late ones and length collapses; pretraining the
critic on Monte-Carlo returns (lambda 1.0) of the fixed policy removes the bias. Its further
changes: decoupled GAE (critic's returns with lambda 1.0, actor's advantages with 0.95) and
length-adaptive actor lambda = 1 - 1/(alpha * |o|). The arms add one change at a time:

    PPO                      critic from the policy, lambda 0.95 for both
    + value pretraining      --pretrain steps of critic-only training first (lambda 1.0 there,
                             reinforge/trainers/stages.py), then PPO as above
    + pretraining + decoupled GAE   algorithm.lam_critic=1.0 in the PPO steps too
    + pretraining + length-adaptive lambda   algorithm.length_adaptive_alpha=0.05

`python benchmarks/studies/long_value_pretraining.py [--steps 24 --pretrain 8 --seeds 0,1,2]`;
writes benchmarks/studies/out/long_value_pretraining/{adv_position.png, length.png,
explained_var.png, summary.md}. Steps are counted from the first policy update in every arm.
diag/adv_pos_corr is the trainer's per-step Pearson correlation of advantage with token index
over all valid response tokens of the batch (reinforge/trainers/metrics.py).
"""
from __future__ import annotations

from long_common import band_plot, cell, parse, run_arms, table, val, window

# 8 prompts x 4 samples: PPO needs no groups, and half the batch halves the cost of 12 runs.
SHARED = ["actor.lr=5e-5", "critic.lr=1e-4", "rollout.n=4", "algorithm.lam=0.95", "algorithm.use_kl_in_reward=false"]


def main() -> None:
    args, out = parse("long_value_pretraining", steps=24, pretrain=8)
    pretrain = args.pretrain
    pre = [f"algorithm.value_pretrain_steps={pretrain}"]
    arms = {
        "PPO": [],
        f"+ value pretraining ({pretrain} steps)": pre,
        "+ pretraining + decoupled GAE (critic lambda 1.0)": pre + ["algorithm.lam_critic=1.0"],
        "+ pretraining + length-adaptive lambda (alpha 0.05)": pre + ["algorithm.length_adaptive_alpha=0.05"],
    }
    steps = lambda name: args.steps + (pretrain if name != "PPO" else 0)  # noqa: E731
    runs = run_arms(out.name, {n: ("ppo", SHARED + o) for n, o in arms.items()}, args, total_steps=steps)
    # Align every arm on its first policy update (step 1); drop the pretraining steps.
    aligned = {n: [[{**r, "step": r["step"] - (steps(n) - args.steps)} for r in rows
                    if r["step"] > steps(n) - args.steps or r["step"] == 0] for rows in per_seed]
               for n, per_seed in runs.items()}
    band_plot(aligned, "diag/adv_pos_corr", "Advantage vs token position (Pearson r)", "correlation",
              out / "adv_position.png")
    band_plot(aligned, "response_length/mean", "Response length", "tokens", out / "length.png")
    band_plot(aligned, "critic/vf_explained_var", "Critic explained variance", "explained variance",
              out / "explained_var.png")
    rows = [[n, cell([window(r, "diag/adv_pos_corr", first=5) for r in rs]),
             cell([window(r, "diag/adv_pos_corr", last=5) for r in rs]),
             cell([window(r, "critic/vf_explained_var", first=5) for r in rs]),
             cell([window(r, "response_length/mean", first=5) for r in rs]),
             cell([window(r, "response_length/mean", last=5) for r in rs]), cell([val(r) for r in rs])]
            for n, rs in aligned.items()]
    md = table(["arm", "adv-position corr first 5", "adv-position corr last 5", "explained var first 5",
                "length first 5", "length last 5", "greedy acc final"], rows)
    (out / "summary.md").write_text(f"{len(args.seeds)} seeds, {args.steps} PPO steps; mean [min, max] over seeds.\n\n"
                                    f"{md}\n")
    print(md)


if __name__ == "__main__":
    main()
