"""Why RL struggles on the tiny demo model: reward along the GRPO gradient direction.

One big GRPO batch (128 prompts x 8 samples) from the SFT base gives the policy gradient g.
The parameters are then moved to theta - s * g / |g| for several step norms s, and the
expected sampled reward of the *same* prompts is re-measured with common random numbers
(the same sampling seed for every s), so the curve shows the local landscape, not sampling
noise. Also for the gradient of the positive-advantage samples only and of the negative ones.

    python benchmarks/studies/gradient_landscape.py [--base runs/demo/sft/hf]

Prints a table of reward vs step norm. For comparison: one Adam step moves every parameter by
about the learning rate, a step norm of about lr * sqrt(#params) (0.017 at lr 1e-5 for 3M).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import ROOT, get_base, table  # noqa: E402

STEPS = [0.0, 0.003, 0.01, 0.03, 0.1]
# (benchmarks/demo_tuning/README.md's landscape table came from an earlier, uncommitted version
# with another grid: 0.002, 0.005, 0.3 and negative steps.)


def _shown(path: Path) -> str:
    """The base folder as written in summary.md: relative to the repository root when inside it."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def policy_gradient(trainer, batch, which: str) -> dict[str, torch.Tensor]:
    from reinforge.algos.aggregation import agg_denominators

    adv = batch["advantages"]
    adv = adv.clamp(min=0) if which == "positive" else adv.clamp(max=0) if which == "negative" else adv
    b = batch.select(batch.keys())
    b.tensors["advantages"] = adv
    model = trainer.actor_model
    model.train()
    model.zero_grad()
    denom = agg_denominators(b["response_mask"].float())
    for mb in b.split(256):
        loss, _ = trainer.actor._micro_loss(mb, denom, 1.0)
        loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def main() -> None:
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers import stages
    from reinforge.trainers.rl import RLTrainer
    from reinforge.trainers.validation import prompts_batch

    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default=None, help="SFT base folder (default: the demo's)")
    args = ap.parse_args()
    out = Path(__file__).parent / "out" / "gradient_landscape"
    out.mkdir(parents=True, exist_ok=True)
    base, paths = get_base(out)
    base = Path(args.base) if args.base else base
    cfg = load_config(RLConfig, "grpo", [
        f"model.path={base}", f"data.train_files=[{paths['train']}]", f"trainer.run_dir={ROOT / 'runs' / 'studies' / 'gradient_landscape'}",
        "data.train_batch_size=128", "rollout.n=8", "actor.micro_batch_size=256", "trainer.loggers=[]",
        "actor.use_kl_loss=false", "actor.loss_agg_mode=token-mean", "data.max_prompt_length=16",
        "rollout.max_response_length=8", "reward.functions=[{name: arithmetic}]"])
    torch.manual_seed(0)
    t = RLTrainer(cfg)
    t.step_idx = 1
    batch, _ = t.collect_batch()
    batch = batch | t.actor.log_probs(batch)
    batch = batch | stages.advantages_stage(batch, cfg.algorithm)
    seen = list(dict.fromkeys(batch["prompt_text"]))
    by_text = {it["prompt_text"]: it for it in (t.loader.dataset[i] for i in range(len(t.loader.dataset)))}
    items = [by_text[p] for p in seen]
    theta0 = {n: p.detach().clone() for n, p in t.actor_model.named_parameters()}

    def reward_at(direction, s) -> float:
        with torch.no_grad():
            norm = torch.sqrt(sum((g ** 2).sum() for g in direction.values()))
            for n, p in t.actor_model.named_parameters():
                p.copy_(theta0[n] - s * direction[n] / norm)
        torch.manual_seed(123)  # common random numbers across step sizes
        b = t.rollout.generate(prompts_batch(items, 10 ** 6), n=8, temperature=1.0)
        return float(t.reward.score(b).scores.mean())

    rows = []
    for which in ("all", "positive", "negative"):
        g = policy_gradient(t, batch, which)
        rows.append([which] + [reward_at(g, s) for s in STEPS])
        print(rows[-1], flush=True)
    md = table(["gradient of"] + [f"step {s}" for s in STEPS], rows)
    md = (f"Sampled reward (mean of 8 samples x {len(items)} in-sample prompts) after a step of the given L2 norm "
          f"along the normalised GRPO gradient, base {_shown(base)}.\n\n" + md)
    (out / "summary.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
