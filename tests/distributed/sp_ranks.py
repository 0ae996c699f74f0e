"""The cases of tests/distributed/test_sequence_parallel.py, run by one process (the test itself:
no sequence parallelism) or, as a script, by each of 2 gloo ranks in one sequence-parallel group
with FSDP2 (`python tests/distributed/sp_ranks.py RANK PORT MODEL_DIR OUT_DIR`, rank 0 and 1).

Each case builds an actor and a critic from the tiny model (the same weights everywhere: read
from its folder), computes the old log-probs, entropies and values of a batch whose rows do not
split evenly (15 positions: the ranks' halves meet inside the responses), then one update of
each (one mini-batch of 4 micro-batches: one optimizer step, whose gradient is recorded:
tests/grad_check.py).
"""
from __future__ import annotations

import os
import sys

import torch

CASES = {
    # name: (model.use_packing, model.fused_logprobs, actor.loss_agg_mode, token budget, activation checkpointing)
    "padded_fused": (False, True, "token-mean", 0, False),
    "padded_logits": (False, False, "seq-mean-token-mean", 0, False),
    "packed_fused": (True, True, "seq-mean-token-sum", 40, False),
    "packed_checkpointed": (True, True, "token-mean", 40, True),  # the backward's recompute runs the all-to-alls
}
P, T, B = 8, 7, 8


def batch(vocab: int):
    from tests.conftest import ragged_batch

    return ragged_batch(vocab, B, P, T, advantages=lambda g: torch.randn(B, T, generator=g),
                        returns=lambda g: torch.randn(B, T, generator=g))


def workers(model_dir: str, case: str, shard=None):
    from reinforge.config.schema import ActorConfig, CriticConfig, ModelConfig
    from reinforge.models.loading import load_causal_lm, load_critic
    from reinforge.workers.actor import ActorWorker
    from reinforge.workers.critic import CriticWorker

    packing, fused, agg, budget, ckpt = CASES[case]
    shard = shard or (lambda m: m)
    actor_model = shard(load_causal_lm(model_dir, dtype="float32", gradient_checkpointing=ckpt))
    torch.manual_seed(0)  # the critic's value head: the same initialisation in every process
    critic_model = shard(load_critic(model_dir, dtype="float32", gradient_checkpointing=ckpt))
    # No clipping: the recorded gradients keep their scale (tests/grad_check.py).
    acfg = ActorConfig(lr=1e-3, micro_batch_size=2, max_tokens_per_micro_batch=budget, entropy_coeff=0.01,
                       grad_clip=0, loss_agg_mode=agg, use_kl_loss=False)
    actor = ActorWorker(actor_model, acfg, ModelConfig(path=model_dir, use_packing=packing, fused_logprobs=fused),
                        total_steps=2, mini_batch_size=8, micro_batch_size=2, loss_norm_const=7, seed=0)
    ccfg = CriticConfig(lr=1e-3, micro_batch_size=2, max_tokens_per_micro_batch=budget, grad_clip=0)
    critic = CriticWorker(critic_model, ccfg, total_steps=2, mini_batch_size=8, micro_batch_size=2, seed=0,
                          use_packing=packing)
    return actor, critic


def run_case(model_dir: str, case: str, shard=None) -> dict:
    """-> old log-probs, entropies, values (B, T), each update's recorded gradients and metrics."""
    from tests.grad_check import record_steps

    actor, critic = workers(model_dir, case, shard)
    data = batch(actor.model.config.vocab_size)
    lp = actor.log_probs(data)
    values = critic.values(data)["values"]
    data = data | lp.select(["old_log_probs"]) | critic.values(data)
    out = {"old_log_probs": lp["old_log_probs"], "entropy": lp["entropy"], "values": values,
           "response_mask": data["response_mask"]}
    for name, w in (("actor", actor), ("critic", critic)):
        steps = record_steps(w.opt, w.params)
        out[f"{name}_metrics"] = w.update(data)
        out[f"{name}_grads"] = steps
    return out


def main(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from reinforge.distributed import fsdp
    from reinforge.models import seq_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    seq_parallel.init_groups(2)
    results = {case: run_case(model_dir, case, fsdp.shard_model) for case in CASES}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
