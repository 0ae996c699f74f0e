"""Study 3: PPO with vs without value pretraining (VAPO): correlation of advantage with token
position early in training, and response length over training.

VAPO's claim: a critic initialised from the policy is biased, giving early tokens larger
advantages (positive correlation with position reversed), which drives responses shorter;
pretraining the critic on Monte-Carlo returns of the fixed policy removes the bias.

Confound: the arms differ in two ways. The pretraining arm also sets algorithm.lam_critic=1.0,
so in its PPO steps the critic's returns use GAE lambda 1.0 (VAPO's decoupled GAE), while the
control's critic uses lambda 0.95 (lam_critic unset = algorithm.lam). The actor's lambda is 0.95
in both. A difference between the arms does not isolate value pretraining.

`python benchmarks/studies/value_pretraining.py [--steps 40 --pretrain 20]`; writes
benchmarks/studies/out/value_pretraining/{adv_position.png, length.png, summary.md}.
"""
from __future__ import annotations

from common import SHARED, final_val, plot, run_arm, series, setup, table, window_mean


def main() -> None:
    args, out, base, paths = setup("value_pretraining", pretrain=20)
    shared = ["actor.lr=3e-5", "critic.lr=1e-4", "data.train_batch_size=8", "rollout.n=4",
              "rollout.max_response_length=12", "data.max_prompt_length=16", "algorithm.lam=0.95",
              "algorithm.use_kl_in_reward=false", *SHARED]
    arms = {
        "PPO, critic from policy": run_arm("no_pretrain", "ppo", shared + [f"trainer.total_steps={args.steps}"],
                                           base, paths, out),
        f"PPO, {args.pretrain} steps value pretraining": run_arm(
            "pretrain", "ppo", shared + [f"trainer.total_steps={args.steps + args.pretrain}",
                                         f"algorithm.value_pretrain_steps={args.pretrain}", "algorithm.lam_critic=1.0"],
            base, paths, out),
    }
    # Align the pretrained arm on its first policy update, so both plots start at PPO step 1.
    aligned = {}
    for name, rows in arms.items():
        shift = args.pretrain if "pretraining" in name else 0
        aligned[name] = [{**r, "step": r["step"] - shift} for r in rows if r["step"] > shift or r["step"] == 0]
    plot(aligned, "diag/adv_pos_corr", "Advantage vs token position (Pearson r)", "correlation", out / "adv_position.png", k=3)
    plot(aligned, "response_length/mean", "Response length", "tokens", out / "length.png")
    plot(aligned, "critic/vf_explained_var", "Critic explained variance", "explained variance", out / "explained_var.png")
    rows = [[n, window_mean(r, "diag/adv_pos_corr", first=5), window_mean(r, "critic/vf_explained_var", first=5),
             series(r, "response_length/mean")[1][0] if series(r, "response_length/mean")[1] else float("nan"),
             window_mean(r, "response_length/mean", last=5), final_val(r)] for n, r in aligned.items()]
    md = table(["arm", "adv-position corr, first 5 PPO steps", "explained var, first 5", "length step 1",
                "length last 5", "final greedy acc"], rows)
    (out / "summary.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
