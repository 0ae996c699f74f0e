"""Study 2: seq-mean-token-mean (GRPO) vs token-mean (DAPO) vs Dr.GRPO: length of incorrect
responses over training (the length bias argued in seed 004: dividing by |o_i| punishes long
wrong answers less).

`python benchmarks/studies/loss_agg_length.py [--steps 40]`; writes
benchmarks/studies/out/loss_agg_length/{incorrect_length.png, summary.md}.
"""
from __future__ import annotations

from common import SHARED, final_val, plot, run_arm, setup, table, window_mean

ARMS = {
    "seq-mean-token-mean (GRPO)": ("grpo", ["actor.loss_agg_mode=seq-mean-token-mean"]),
    "token-mean (DAPO)": ("grpo", ["actor.loss_agg_mode=token-mean"]),
    "Dr.GRPO": ("drgrpo", []),
}


def main() -> None:
    args, out, base, paths = setup("loss_agg_length")
    # Room to ramble: responses may run to 16 tokens although answers need 3.
    shared = [f"trainer.total_steps={args.steps}", "actor.lr=3e-5", "data.train_batch_size=8", "rollout.n=8",
              "rollout.max_response_length=16", "data.max_prompt_length=16", "actor.use_kl_loss=false", *SHARED]
    arms = {name: run_arm(f"arm_{i}", preset, shared + o, base, paths, out)
            for i, (name, (preset, o)) in enumerate(ARMS.items())}
    plot(arms, "response_length/incorrect_mean", "Length of incorrect responses", "tokens", out / "incorrect_length.png")
    plot(arms, "response_length/correct_mean", "Length of correct responses", "tokens", out / "correct_length.png")
    rows = [[n, window_mean(r, "response_length/incorrect_mean", first=5),
             window_mean(r, "response_length/incorrect_mean", last=5),
             window_mean(r, "response_length/correct_mean", last=5), window_mean(r, "reward/acc", last=5), final_val(r)]
            for n, r in arms.items()]
    md = table(["arm", "incorrect len first 5", "incorrect len last 5", "correct len last 5", "train acc last 5",
                "final greedy acc"], rows)
    (out / "summary.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
