"""trainer.backend=ray on CPU: 2 Ray ranks (gloo, FSDP2) reproduce 1 local process exactly, a
killed rank stops the run with a clear message, and a Ray run resumes from its checkpoint."""
from __future__ import annotations

import json
import os
import signal
import sys

import pytest
import torch

ray = pytest.importorskip("ray")
# Its functions run in the rank processes, which cannot import this module: send them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

from reinforge.config.load import load_config  # noqa: E402
from reinforge.config.schema import RLConfig  # noqa: E402
from reinforge.trainers.plan import plan_rl  # noqa: E402
from reinforge.protocol import Batch  # noqa: E402
from reinforge.seeding import seed_everything  # noqa: E402
from tests.conftest import ragged_batch, rl_overrides  # noqa: E402
from tests.grad_check import assert_same_steps, record_steps  # noqa: E402

TOL = 1e-5


def _plan(model_dir, data, run_dir, **extra):
    base = {"actor.mini_batch_size": 8, "critic.mini_batch_size": 8, "actor.ppo_epochs": 2, "actor.lr": 1e-3,
            "actor.micro_batch_size": 2, "critic.micro_batch_size": 2}
    return plan_rl(load_config(RLConfig, "ppo", rl_overrides(model_dir, data, run_dir, **{**base, **extra})))


def _batch(vocab: int, B: int = 16, P: int = 8, T: int = 6) -> Batch:
    return ragged_batch(vocab, B, P, T, advantages=lambda g: torch.randn(B, T, generator=g),
                        returns=lambda g: torch.randn(B, T, generator=g))


def _record_on_rank(rank, role: str) -> None:
    """In a rank process: record the gradient at each of the `role` worker's optimizer steps."""
    worker = rank.workers[role]
    rank.step_grads = record_steps(worker.opt, worker.params)


def _recorded(rank) -> list:
    return rank.step_grads


def _full_state(rank, role: str) -> dict:
    """In a rank process (every rank: a collective): the full weights, on rank 0."""
    from reinforge.distributed import fsdp

    return fsdp.full_model_state(rank.models[role])


def _close(a: torch.Tensor, b: torch.Tensor, m: torch.Tensor) -> float:
    return float((a - b)[m.bool()].abs().max())


def assert_ranks_match_one_process(local, remote, group, batch) -> dict[str, dict]:
    """The local workers and the Ray ranks on `batch`: actor and reference log-probs and critic
    values within TOL; then each role's update (critic, actor; shuffled mini-batches x epochs):
    the same optimizer steps, the same metrics and, gathered to rank 0, the same weights.
    -> {role: the ranks' full state after its update}."""
    m = batch["response_mask"]
    lp_l, lp_r = local.actor.log_probs(batch), remote.actor.log_probs(batch)
    assert _close(lp_l["old_log_probs"], lp_r["old_log_probs"], m) <= TOL
    assert _close(local.reference.log_probs(batch)["ref_log_probs"],
                  remote.reference.log_probs(batch)["ref_log_probs"], m) <= TOL
    v_l, v_r = local.critic.values(batch), remote.critic.values(batch)
    assert _close(v_l["values"], v_r["values"], m) <= TOL
    batch = batch | lp_l.select(["old_log_probs"]) | v_l
    states = {}
    for role in ("critic", "actor"):
        # The gradient of every optimizer step is compared, not the weights after AdamW (see
        # tests/grad_check.py): the ranks record theirs, then the local worker steps with them.
        group.get([r.__ray_call__.remote(_record_on_rank, role) for r in group.ranks])
        mr = getattr(remote, role).update(batch)
        g_r = group.get([group.ranks[0].__ray_call__.remote(_recorded)])[0]
        worker = getattr(local, role)
        g_l = record_steps(worker.opt, worker.params, replay=g_r)
        ml = worker.update(batch)
        assert len(g_r) >= 2  # mini-batches (x epochs): the later steps start from replayed ones
        assert_same_steps(g_l, g_r)
        assert ml.keys() == mr.keys()
        for k in ml:
            assert abs(ml[k] - mr[k]) <= TOL * max(1.0, abs(ml[k])), (k, ml[k], mr[k])
        # The ranks' weights (gathered to rank 0): the same steps from the same weights, so
        # they differ by AdamW's elementwise rounding on shards vs whole tensors at most.
        full = group.get([r.__ray_call__.remote(_full_state, role) for r in group.ranks])[0]
        local_state = getattr(local, f"{role}_model").state_dict()
        assert full.keys() <= local_state.keys() and len(full) >= len(local_state) - 1  # a tied head once
        diff = max(float((local_state[k] - v).abs().max()) for k, v in full.items())
        print(f"{role}: max |w_2ranks - w_1rank| = {diff:.2e}")
        assert diff <= TOL
        states[role] = full
    return states



@pytest.mark.parametrize("fused, packing, sp", [(False, False, 1), (True, False, 1), (True, True, 1), (True, True, 2)])
def test_two_ranks_equal_one_process(ray_cluster, tiny_model_dir, arith_data, tmp_path, fused, packing, sp):
    """Log-probs, values, the gradient at every optimizer step of the PPO updates and their
    metrics agree, and the weights pulled from the ranks then equal the local worker's (which
    stepped with the ranks' gradients); with the fused log-prob path too (padded and packed
    rows), whose LM-head read FSDP gathers through the root's registered forward method; and
    with the two ranks one sequence-parallel group (sp=2: each holds half of every packed row)."""
    from reinforge.distributed.group import WorkerDiedError
    from reinforge.trainers.rl_setup import build_ray_workers, build_workers

    opts = {"model.fused_logprobs": fused, "model.use_packing": packing}
    ray_opts = {"trainer.backend": "ray", "trainer.devices_per_node": 2, "trainer.sequence_parallel": sp}
    local_plan = _plan(tiny_model_dir, arith_data, str(tmp_path / "l"), **opts)
    seed_everything(local_plan.cfg.trainer.seed)
    local = build_workers(local_plan)
    remote, group = build_ray_workers(_plan(tiny_model_dir, arith_data, str(tmp_path / "r"), **ray_opts, **opts))
    batch = _batch(local.actor_model.config.vocab_size)
    assert_ranks_match_one_process(local, remote, group, batch)

    os.kill(group.pids()[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match=r"rank 1 of 2 .*died.*--resume"):
        remote.actor.log_probs(batch)


def test_ray_backend_trains_and_resumes(ray_cluster, tiny_model_dir, arith_data, tmp_path):
    """A GRPO run through RLTrainer with 2 ranks; stopped after step 2 and resumed, it ends with
    the same weights as an uninterrupted 3-step run."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from reinforge.trainers.rl import RLTrainer

    def cfg(run, steps):
        extra = {"trainer.backend": "ray", "trainer.devices_per_node": 2, "trainer.save_every": 1,
                 "trainer.keep_last": 3, "trainer.val_before_train": False, "trainer.total_steps": steps}
        return load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(run), **extra))

    last = RLTrainer(cfg(tmp_path / "a", 3)).fit()
    assert torch.isfinite(torch.tensor(last["actor/pg_loss"])) and "actor/kl_loss" in last
    assert last["actor/grad_norm"] > 0
    assert (tmp_path / "a" / "hf").exists()
    # The run trained: its step-3 weights left the initial ones (else the resume check below
    # would hold for a run that never updates).
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    step3 = load_file(str(tmp_path / "a" / "checkpoints" / "step_3" / "actor.safetensors"))
    common = step3.keys() & base.keys()
    assert len(common) == len(step3), sorted(step3.keys() - base.keys())
    assert any(not torch.equal(step3[k], base[k]) for k in common), "no actor weight changed in 3 steps"
    # The driver holds no weights: rank 0 streamed the export from the shards, and it holds the
    # step-3 weights (the export follows the last checkpoint).
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a" / "hf")).state_dict()
    assert all(torch.equal(exported[k], v) for k, v in step3.items())
    RLTrainer(cfg(tmp_path / "b", 2)).fit()
    trainer = RLTrainer(cfg(tmp_path / "b", 3))
    assert all(p.device.type == "meta" for p in trainer.actor_model.parameters())  # no weights on the driver
    trainer.fit(resume=True)
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 3
    # Each rank wrote its own shards of the actor's weights and optimizer (DCP), beside the
    # unsharded weights the HF export and a local run read.
    shards = tmp_path / "b" / "checkpoints" / "step_2" / "actor_sharded"
    assert (shards / ".metadata").exists() and len(list(shards.glob("*.distcp"))) == 2
    wa = load_file(str(tmp_path / "a" / "checkpoints" / "step_3" / "actor.safetensors"))
    wb = load_file(str(tmp_path / "b" / "checkpoints" / "step_3" / "actor.safetensors"))
    # A resume runs the same code on the same ranks (one thread each) as the uninterrupted run:
    # bit for bit, not within a tolerance (after AdamW a last-bit difference would be amplified).
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_ray_backend_with_lora(ray_cluster, tiny_model_dir, arith_data, tmp_path):
    """LoRA on 2 Ray ranks: the merged export changes only the adapted projections (the rest
    of the model, the reference, stays frozen), and a resumed run ends where an uninterrupted
    one does."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from reinforge.trainers.rl import RLTrainer

    def cfg(run, steps):
        extra = {"trainer.backend": "ray", "trainer.devices_per_node": 2, "trainer.save_every": 1,
                 "trainer.keep_last": 2, "trainer.val_before_train": False, "trainer.total_steps": steps,
                 "model.lora_rank": 4, "actor.lr": 1e-2}
        return load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(run), **extra))

    last = RLTrainer(cfg(tmp_path / "a", 2)).fit()
    assert last["actor/grad_norm"] > 0 and last["actor/ref_kl"] > 0  # the adapter moved off the reference
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    tuned = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a" / "hf")).state_dict()
    changed = {k for k, v in tuned.items() if not torch.equal(v, base[k])}
    assert changed and all(k.split(".")[-2] in {"q_proj", "k_proj", "v_proj", "o_proj"} for k in changed), changed
    RLTrainer(cfg(tmp_path / "b", 1)).fit()
    RLTrainer(cfg(tmp_path / "b", 2)).fit(resume=True)
    wa = load_file(str(tmp_path / "a" / "checkpoints" / "step_2" / "actor.safetensors"))
    wb = load_file(str(tmp_path / "b" / "checkpoints" / "step_2" / "actor.safetensors"))
    assert any("lora_" in k for k in wa)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
