"""On-policy updates skip the old-log-prob forward: the update's own detached log-probs serve as
the old ones. Both paths must take the same optimizer step (gradients, tests/grad_check.py) and
report the same metrics, for every policy loss, with dual clip and with a KL loss."""
from __future__ import annotations

import pytest
import torch

from reinforge.algos.masked import masked_mean
from tests.conftest import ragged_batch
from tests.grad_check import assert_same_steps, record_steps

pytestmark = pytest.mark.usefixtures("one_thread")


def _actor(model_dir, on_policy: bool = False, tis_cap: float | None = None, **actor_kw):
    from reinforge.config.schema import ActorConfig, ModelConfig
    from reinforge.models.loading import load_causal_lm
    from reinforge.workers.actor import ActorWorker

    model = load_causal_lm(model_dir, dtype="float32")
    # No clipping: the recorded gradients keep their scale (tests/grad_check.py).
    cfg = ActorConfig(lr=1e-4, micro_batch_size=4, grad_clip=0, **actor_kw)
    return ActorWorker(model, cfg, ModelConfig(path=model_dir), total_steps=2, mini_batch_size=8, micro_batch_size=4,
                       loss_norm_const=7, seed=0, on_policy=on_policy, tis_cap=tis_cap)


def _batch(vocab: int, B: int = 8, P: int = 4, T: int = 6):
    """Random advantages and a reference that differs from the actor (so the KL terms are not zero)."""
    return ragged_batch(vocab, B, P, T, advantages=lambda g: torch.randn(B, T, generator=g),
                        ref_log_probs=lambda g: -3 + torch.rand(B, T, generator=g))


@pytest.mark.parametrize("kw", [dict(policy_loss="ppo_clip", clip_c=3.0, entropy_coeff=0.01),
                                dict(policy_loss="gspo", use_kl_loss=True, kl_loss_coef=0.1),
                                dict(policy_loss="cispo"), dict(policy_loss="gmpo")])
def test_on_policy_update_equals_update_after_old_log_prob_pass(tiny_model_dir, kw):
    with_pass, without = _actor(tiny_model_dir, **kw), _actor(tiny_model_dir, on_policy=True, **kw)
    batch = _batch(with_pass.model.config.vocab_size)
    old = with_pass.log_probs(batch)
    ga = record_steps(with_pass.opt, with_pass.params)
    gb = record_steps(without.opt, without.params, replay=ga)
    ma, mb = with_pass.update(batch | old), without.update(batch)
    assert_same_steps(ga, gb)
    resp = batch["response_mask"].float()
    # what trainers/metrics.py computes from the separate pass's outputs
    assert mb["actor/entropy"] == pytest.approx(float(masked_mean(old["entropy"], resp)), abs=1e-5)
    assert mb["actor/ref_kl"] == pytest.approx(float(masked_mean(old["old_log_probs"] - batch["ref_log_probs"], resp)),
                                               abs=1e-5)
    assert mb["actor/ppo_kl"] == 0.0 and mb["actor/pg_clipfrac"] == 0.0  # ratio exactly 1
    for k, v in ma.items():
        assert mb[k] == pytest.approx(v, abs=1e-5), k


def test_old_log_probs_required_off_policy(tiny_model_dir):
    from reinforge.workers.actor import on_policy_update

    actor = _actor(tiny_model_dir, ppo_epochs=2)
    with pytest.raises(ValueError, match="on-policy"):
        actor.update(_batch(actor.model.config.vocab_size))
    assert on_policy_update(actor.model, 1, 8, 8)
    assert not on_policy_update(actor.model, 2, 8, 8)  # a second epoch steps at new weights
    assert not on_policy_update(actor.model, 1, 4, 8)  # so does a second mini-batch
    actor.model.config.attention_dropout = 0.1  # train-mode forward != eval-mode forward
    assert not on_policy_update(actor.model, 1, 8, 8)


@pytest.mark.parametrize("config,dropout", [
    ({"attention_dropout": 0.1}, True), ({"attention_dropout": 0.0, "classifier_dropout": 0.3}, False),
    ({"text_config": {"attention_dropout": 0.1}, "vision_config": {"depth": 2}}, True),  # a VLM's language model
    ({"text_config": {"attention_dropout": 0.0}, "vision_config": {"dropout": 0.2}}, True),  # its tower
    ({"text_config": {"attention_dropout": 0.0, "summary_dropout": 0.1}, "vision_config": {}}, False),
    ({"text_config": {"use_dropout": True}}, False),  # a bool is not a rate
])
def test_has_dropout_reads_sub_configs(tmp_path, config, dropout):
    """The plan's dropout check (it decides the on-policy skip of the old-log-prob pass) reads a
    VLM's text_config and vision_config too, not only config.json's top level."""
    import json

    from reinforge.trainers.plan import has_dropout

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert has_dropout(str(tmp_path)) is dropout
