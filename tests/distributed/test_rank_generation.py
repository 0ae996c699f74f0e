"""Generation on the Ray ranks (trainer.backend=ray, 2 CPU ranks, gloo): the rollouts equal one
process's token for token, greedy and seeded sampling alike, before and after an update; a
GRPO run on 2 ranks generates the same samples as on 1 rank; the driver holds no weights."""
from __future__ import annotations

import json

import pytest
import torch

ray = pytest.importorskip("ray")

from reinforge.config.load import load_config  # noqa: E402
from reinforge.config.schema import RLConfig  # noqa: E402
from reinforge.trainers.plan import plan_rl  # noqa: E402
from reinforge.seeding import seed_everything  # noqa: E402
from tests.conftest import ragged_batch, rl_overrides  # noqa: E402
from tests.distributed.test_ray_group import _full_state  # noqa: E402  (sent to the ranks by value)


def _prompts(arith_data, tok, cfg, k: int):
    from reinforge.trainers.rl_setup import load_prompts
    from reinforge.trainers.validation import prompts_batch

    data = load_prompts([arith_data["train"]], tok, cfg)
    return prompts_batch([data[i] for i in range(k)], 100)


def _same_rows(a, b) -> None:
    assert torch.equal(a["responses"], b["responses"])
    assert torch.equal(a["response_mask"], b["response_mask"])
    assert torch.equal(a["group_ids"], b["group_ids"])
    m = a["response_mask"].bool()
    assert float((a["rollout_log_probs"] - b["rollout_log_probs"])[m].abs().max()) <= 1e-5


def test_rank_rollouts_equal_one_process(ray_cluster, tiny_model_dir, arith_data, tmp_path):
    """5 prompts over 2 ranks (shares of 2 and 3): greedy rows equal the local rollout's token
    for token; seeded sampled rows equal one in-process engine given the same call seed (each
    prompt draws from prompt_seed(seed, uid), wherever it runs); after an update the ranks'
    engines generate with the new weights (equal to a local engine loaded with them)."""
    from reinforge.distributed.engine import RankEngine
    from reinforge.distributed.proxies import RankRollout
    from reinforge.models.loading import load_tokenizer
    from reinforge.trainers.rl_setup import build_ray_workers, load_actor_model, make_rollout

    over = rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **{
        "trainer.backend": "ray", "trainer.devices_per_node": 2, "rollout.max_response_length": 8,
        "actor.mini_batch_size": 8, "actor.micro_batch_size": 4})
    plan = plan_rl(load_config(RLConfig, "grpo", over))
    cfg = plan.cfg
    tok = load_tokenizer(tiny_model_dir)
    w, group = build_ray_workers(plan)
    assert all(p.device.type == "meta" for p in w.actor_model.parameters())  # the driver holds no weights
    rollout = RankRollout(group, w.actor)
    prompts = _prompts(arith_data, tok, cfg, 5)
    dense = load_actor_model(plan).requires_grad_(False)
    local = RankEngine(make_rollout(cfg, dense, tok), dense)  # version None: never syncs (weights set below)

    def check() -> None:
        greedy = rollout.generate(prompts, n=1, greedy=True)
        _same_rows(greedy, make_rollout(cfg, local.dense, tok).generate(prompts, n=1, greedy=True))
        torch.manual_seed(7)
        sampled = rollout.generate(prompts, n=4, temperature=1.0)
        torch.manual_seed(7)
        seed = int(torch.randint(0, 2**62, (1,)))
        mine = local.generate(None, None, prompts, {"n": 4, "temperature": 1.0, "greedy": False}, seed)
        _same_rows(sampled, mine)
        assert len(sampled) == 20 and sampled["responses"].unique().numel() > 3  # really sampled

    check()
    # An update on the ranks: their engines resync (the version moved on); the local engine
    # is loaded with the ranks' weights gathered to rank 0.
    batch = ragged_batch(len(tok), 8, 8, 8, advantages=lambda g: torch.randn(8, 8, generator=g),
                         old_log_probs=lambda g: -torch.rand(8, 8, generator=g),
                         ref_log_probs=lambda g: -torch.rand(8, 8, generator=g))
    w.actor.update(batch)
    full = group.get([r.__ray_call__.remote(_full_state, "actor") for r in group.ranks])[0]
    assert any(not torch.equal(full[k], v) for k, v in dense.state_dict().items() if k in full)
    dense.load_state_dict(full, strict=False)  # strict=False: the tied head is stored once
    check()
    group.shutdown()


def test_grpo_two_ranks_generate_as_one(ray_cluster, tiny_model_dir, arith_data, tmp_path):
    """A 2-step GRPO run (sampling at temperature 1) on 2 ranks and on 1 rank: every sample of
    both steps is the same text (step 2's after an update whose weights differ between the two
    runs only by float rounding), and the losses agree closely."""
    from safetensors.torch import load_file

    from reinforge.trainers.rl import RLTrainer

    def run(name, ranks):
        extra = {"trainer.backend": "ray", "trainer.devices_per_node": ranks, "trainer.val_before_train": False,
                 "trainer.log_samples_every": 1, "trainer.save_every": 2}
        seed_everything(0)
        last = RLTrainer(load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / name),
                                                                     **extra))).fit()
        samples = [[json.loads(x) for x in (tmp_path / name / "samples" / f"train_step_{s}.jsonl").read_text().splitlines()]
                   for s in (1, 2)]
        return last, samples

    last2, s2 = run("two", 2)
    last1, s1 = run("one", 1)
    for step2, step1 in zip(s2, s1):
        assert [r["response"] for r in step2] == [r["response"] for r in step1]
        assert len({r["response"] for r in step2}) > 1
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean"):
        print(f"{k}: 2 ranks {last2[k]:.8g}, 1 rank {last1[k]:.8g}")
        assert abs(last2[k] - last1[k]) <= 1e-4 * max(1.0, abs(last1[k])), (k, last2[k], last1[k])
    w2, w1 = (load_file(str(tmp_path / name / "checkpoints" / "step_2" / "actor.safetensors")) for name in ("two", "one"))
    diff = max(float((w2[k] - w1[k]).abs().max()) for k in w1)
    print(f"max |w_2ranks - w_1rank| after 2 steps: {diff:.2e}")
