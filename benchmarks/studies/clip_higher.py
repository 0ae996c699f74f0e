"""Study 1: symmetric clip (0.2/0.2) vs clip-higher (0.2/0.28): policy entropy over training.

DAPO's claim: raising the upper clip lets low-probability tokens grow, slowing entropy
collapse. One command: `python benchmarks/studies/clip_higher.py [--steps 40]`; writes
benchmarks/studies/out/clip_higher/{entropy.png, clipfrac.png, summary.md}.

Clip metrics (reinforge/algos/policy_loss.py, ppo_clip): actor/pg_clipfrac is the share of tokens
clipped at the bound that binds for their advantage sign (upper with A > 0, lower with A < 0),
so both bounds together; actor/pg_clipfrac_lower is the dual-clip fraction (actor.clip_c), which
this study never sets, so it is 0.
"""
from __future__ import annotations

from common import SHARED, final_val, plot, run_arm, setup, table, window_mean

ARMS = {"symmetric 0.2/0.2": ["actor.clip_high=0.2"], "clip-higher 0.2/0.28": ["actor.clip_high=0.28"]}


def main() -> None:
    args, out, base, paths = setup("clip_higher")
    # Sixteen updates per batch (4 epochs x 4 mini-batches) take the policy off its sampling
    # distribution, so clipping binds and the two arms can differ.
    shared = [f"trainer.total_steps={args.steps}", "actor.lr=3e-5", "actor.ppo_epochs=4", "actor.mini_batch_size=16",
              "data.train_batch_size=8", "rollout.n=8", "rollout.max_response_length=8", "data.max_prompt_length=16",
              "actor.loss_agg_mode=token-mean", "actor.use_kl_loss=false", *SHARED]
    arms = {name: run_arm(f"arm_{i}", "grpo", shared + o, base, paths, out) for i, (name, o) in enumerate(ARMS.items())}
    plot(arms, "actor/entropy", "Policy entropy: symmetric clip vs clip-higher", "entropy (nats / token)",
         out / "entropy.png")
    plot(arms, "actor/pg_clipfrac", "Clip fraction (either bound, pg_clipfrac)", "fraction of tokens", out / "clipfrac.png")
    rows = [[n, window_mean(r, "actor/entropy", first=5), window_mean(r, "actor/entropy", last=5),
             window_mean(r, "actor/pg_clipfrac"), window_mean(r, "actor/pg_clipfrac_lower"), final_val(r)]
            for n, r in arms.items()]
    md = table(["arm", "entropy first 5 steps", "entropy last 5 steps", "mean clipfrac (either bound)", "mean dual-clip frac",
                "final greedy acc"], rows)
    (out / "summary.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
