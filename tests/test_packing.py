"""Sequence packing: plans, packed forward == padded forward, packed update == padded update."""
from __future__ import annotations

import pytest
import torch

from reinforge.models.forward import response_logprobs, response_values
from reinforge.models.packing import (balanced_groups, first_fit_decreasing, num_token_groups, pack,
                                      packed_response_logprobs, packed_response_values)
from tests.grad_check import assert_same_steps, record_steps


def test_first_fit_decreasing_respects_capacity():
    lengths = [5, 3, 7, 2, 4, 1]
    bins = first_fit_decreasing(lengths, 8)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum(lengths[i] for i in b) <= 8 for b in bins)
    assert len(bins) == 3  # 22 tokens need at least ceil(22/8) = 3 rows
    with pytest.raises(ValueError, match="does not fit"):
        first_fit_decreasing([9], 8)


def test_token_budget_groups_balanced_and_within_budget():
    lengths = [10, 9, 8, 3, 3, 2, 2, 1]
    k = num_token_groups(lengths, 12)
    groups = balanced_groups(lengths, k)
    assert sorted(i for g in groups for i in g) == list(range(8))
    sums = [sum(lengths[i] for i in g) for g in groups]
    assert max(sums) <= 12 and k == 4  # 38 tokens: ceil(38/12) = 4 groups suffice
    # a sequence above the budget gets a group of its own rather than failing
    assert num_token_groups([20, 1], 12) == 2


def _ragged_batch(vocab: int, B: int = 6, P: int = 5, T: int = 7, seed: int = 0):
    """Left-padded prompts and right-padded responses of varied lengths, like a rollout batch."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, P + T), generator=g)
    mask = torch.zeros(B, P + T, dtype=torch.long)
    for b in range(B):
        p = 1 + b % P
        r = 1 + (3 * b) % T
        mask[b, P - p:P + r] = 1
    ids = ids * mask  # pad id 0
    return ids, mask, T


def test_pack_layout(tiny_model_dir):
    ids, mask, _ = _ragged_batch(20)
    p = pack(ids, mask)
    valid = mask.bool()
    assert p.num_tokens == int(mask.sum())
    assert p.input_ids.numel() < ids.numel()  # padding removed
    assert torch.equal(p.input_ids.view(-1)[p.dest[valid]], ids[valid])
    for b in range(len(ids)):  # every sequence's positions restart at 0 and are consecutive
        n = int(mask[b].sum())
        assert p.position_ids.view(-1)[p.dest[b][valid[b]]].tolist() == list(range(n))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("fused", [True, False])
def test_packed_logprobs_equal_padded(tiny_model_dir, attn, fused):
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir, dtype="float32", attn_implementation=attn, train=False)
    ids, mask, T = _ragged_batch(model.config.vocab_size)
    resp_mask = mask[:, -T:].bool()
    with torch.no_grad():
        ref, ref_ent = response_logprobs(model, ids, mask, T, with_entropy=True, fused=fused)
        got, ent = packed_response_logprobs(model, ids, mask, T, with_entropy=True, fused=fused)
    assert (got[resp_mask] - ref[resp_mask]).abs().max() <= 1e-5
    assert (ent[resp_mask] - ref_ent[resp_mask]).abs().max() <= 1e-5
    assert torch.all(got[~resp_mask] == 0)


def test_packed_values_equal_padded(tiny_model_dir):
    from reinforge.models.loading import load_critic

    critic = load_critic(tiny_model_dir, dtype="float32")
    torch.nn.init.normal_(critic.score.weight, std=0.1)
    ids, mask, T = _ragged_batch(critic.config.vocab_size, seed=1)
    resp_mask = mask[:, -T:].bool()
    with torch.no_grad():
        ref = response_values(critic, ids, mask, T)
        got = packed_response_values(critic, ids, mask, T)
    assert (got[resp_mask] - ref[resp_mask]).abs().max() <= 1e-5


def _actor(model_dir, use_packing: bool, max_tokens: int, micro: int = 2, tis_cap: float | None = None):
    from reinforge.config.schema import ActorConfig, ModelConfig
    from reinforge.models.loading import load_causal_lm
    from reinforge.workers.actor import ActorWorker

    model = load_causal_lm(model_dir, dtype="float32")
    # No clipping: the recorded gradients keep their scale (tests/grad_check.py).
    cfg = ActorConfig(lr=1e-4, micro_batch_size=micro, max_tokens_per_micro_batch=max_tokens, entropy_coeff=0.01,
                      grad_clip=0)
    return ActorWorker(model, cfg, ModelConfig(path=model_dir, use_packing=use_packing), total_steps=2,
                       mini_batch_size=6, micro_batch_size=micro, loss_norm_const=7, seed=0, tis_cap=tis_cap)


def _rl_batch(vocab: int):
    from reinforge.protocol import Batch

    ids, mask, T = _ragged_batch(vocab, B=12)
    g = torch.Generator().manual_seed(3)
    return Batch({"input_ids": ids, "attention_mask": mask, "responses": ids[:, -T:],
                  "response_mask": mask[:, -T:], "advantages": torch.randn(len(ids), T, generator=g)})


def test_packed_update_equals_padded_update(tiny_model_dir):
    """Token-budget micro-batches on packed rows give the same old log-probs, the same
    accumulated gradient at each optimizer step (the packed actor steps with the padded one's,
    so both stay at the same weights: tests/grad_check.py) and the same metrics as fixed
    micro-batches on padded rows."""
    padded, packed = _actor(tiny_model_dir, False, 0), _actor(tiny_model_dir, True, 16)
    batch = _rl_batch(padded.model.config.vocab_size)
    lp_a, lp_b = padded.log_probs(batch), packed.log_probs(batch)
    m = batch["response_mask"].bool()
    assert (lp_a["old_log_probs"][m] - lp_b["old_log_probs"][m]).abs().max() <= 1e-5
    batch = batch | lp_a.select(["old_log_probs"])
    ga = record_steps(padded.opt, padded.params)
    gb = record_steps(packed.opt, packed.params, replay=ga)
    ma, mb = padded.update(batch), packed.update(batch)
    assert_same_steps(ga, gb)
    _assert_metrics_match(ma, mb)


def test_equal_count_partition_balances_tokens():
    from reinforge.models.packing import equal_count_partition

    lengths = [100, 90, 10, 5, 50, 45, 3, 2]
    parts = equal_count_partition(lengths, 2)
    assert [len(p) for p in parts] == [4, 4] and sorted(sum(parts, [])) == list(range(8))
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert abs(sums[0] - sums[1]) <= 20  # contiguous halves would be 245 vs 60
    with pytest.raises(ValueError, match="equal parts"):
        equal_count_partition([1, 2, 3], 2)


def test_packed_critic_update_equals_padded(tiny_model_dir):
    from reinforge.config.schema import CriticConfig
    from reinforge.models.loading import load_critic
    from reinforge.workers.critic import CriticWorker

    def critic(packed: bool):
        torch.manual_seed(0)
        model = load_critic(tiny_model_dir, dtype="float32")
        cfg = CriticConfig(lr=1e-4, micro_batch_size=2, max_tokens_per_micro_batch=16 if packed else 0, grad_clip=0)
        return CriticWorker(model, cfg, total_steps=2, mini_batch_size=6, micro_batch_size=2, seed=0,
                            use_packing=packed)

    a, b = critic(False), critic(True)
    batch = _rl_batch(a.model.config.vocab_size)
    va, vb = a.values(batch), b.values(batch)
    m = batch["response_mask"].bool()
    assert (va["values"] - vb["values"])[m].abs().max() <= 1e-5
    batch = batch | va | _returns(batch)
    ga = record_steps(a.opt, a.params)
    gb = record_steps(b.opt, b.params, replay=ga)
    ma, mb = a.update(batch), b.update(batch)
    assert_same_steps(ga, gb)
    _assert_metrics_match(ma, mb)


def _assert_metrics_match(ma: dict, mb: dict) -> None:
    """Update metrics agree to 1e-5 relative; those that are differences of O(1) log-probs or
    values (ppo_kl, vpred_mean, explained variance) sit at the rounding noise of those inputs,
    hence the scale floor of 1."""
    assert ma.keys() == mb.keys()
    for k in ma:
        assert abs(ma[k] - mb[k]) <= 1e-5 * max(1.0, abs(ma[k])), (k, ma[k], mb[k])


def _returns(batch):
    from reinforge.protocol import Batch

    return Batch({"returns": torch.randn(batch["advantages"].shape, generator=torch.Generator().manual_seed(5))})
