"""Every algorithm preset runs a few steps end to end on the tiny model, and each preset's
distinctive mechanism is checked (dynamic sampling refills, overlong filtering masks truncated
responses, value pretraining freezes the policy and lowers the value loss, ...)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from reinforge.config.load import PRESET_DIR, list_presets, load_config, yaml_header
from reinforge.config.schema import RLConfig
from reinforge.protocol import Batch
from reinforge.trainers import stages
from reinforge.trainers.rl import RLTrainer
from tests.conftest import rl_overrides

# Every RL algorithm preset, so a new one is covered automatically. Left out: the SFT, DPO and
# reward-model presets (not RL: their first line names another command, e.g. `# dpo: ...` for
# simpo and kto), and the demo presets (sized for `reinforge demo`, which tests/test_demo.py runs).
PRESETS = [p for p in list_presets()
           if yaml_header(PRESET_DIR / f"{p}.yaml")[0] == "train" and not p.startswith("demo_")]


def test_preset_list_covers_the_rl_algorithms():
    """The derived list drops no known algorithm and holds only presets that load as RL configs."""
    assert {"ppo", "grpo", "dapo", "gspo", "drgrpo", "vapo", "rloo", "reinforce_pp", "reinforce_pp_baseline",
            "remax"} <= set(PRESETS), PRESETS
    for name in PRESETS:
        assert isinstance(load_config(RLConfig, name), RLConfig), name


def _run(preset, tiny_model_dir, arith_data, run_dir, before_fit=None, **extra):
    extra = {"trainer.val_before_train": False, "data.val_files": "[]", "trainer.export_hf": False, **extra}
    cfg = load_config(RLConfig, preset, rl_overrides(tiny_model_dir, arith_data, str(run_dir), **extra))
    trainer = RLTrainer(cfg)
    before = {k: v.detach().clone() for k, v in trainer.actor_model.state_dict().items()}
    if before_fit is not None:
        before_fit(trainer)
    trainer.fit()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, before, [r for r in rows if r["step"] > 0]


def _changed(trainer, before) -> bool:
    return any(not torch.equal(v, before[k]) for k, v in trainer.actor_model.state_dict().items())


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "vapo"])
def test_preset_trains(preset, tiny_model_dir, arith_data, tmp_path):
    # DAPO's overlong filter drops every response without EOS from the loss, and the untrained
    # model rarely emits EOS: longer responses give some rows an EOS on any CPU's sampling.
    extra = {"rollout.n": 1} if preset == "remax" else {"rollout.max_response_length": 16} if preset == "dapo" else {}
    if preset == "distill":  # a teacher unlike the student (tests/test_distill_e2e.py checks the mechanism)
        from reinforge.models.tiny import make_tiny_model
        from reinforge.tasks import build_char_tokenizer

        make_tiny_model(build_char_tokenizer(), str(tmp_path / "teacher"), seed=1, hidden_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, intermediate_size=128)
        extra = {"teacher.path": str(tmp_path / "teacher")}
    trainer, before, rows = _run(preset, tiny_model_dir, arith_data, tmp_path, **extra)
    if preset == "dapo" and all(r["overlong/filtered_frac"] == 1.0 for r in rows):
        assert not _changed(trainer, before), "dapo: every response was filtered, yet parameters moved"
    else:
        assert _changed(trainer, before), f"{preset}: no parameter changed"
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/advantages/mean", "actor/entropy"):
        assert math.isfinite(rows[-1][key]), (preset, key)
    if preset == "dapo":
        # Dynamic sampling: only groups with differing rewards are trained on.
        assert all(r["diag/zero_var_group_frac"] == 0.0 for r in rows)
        assert all(r["dynamic_sampling/gen_rounds"] >= 1 for r in rows)
        assert "overlong/filtered_frac" in rows[-1] and "reward/overlong_penalty_mean" in rows[-1]
    if preset == "remax":
        assert "remax/baseline_score_mean" in rows[-1]
    if preset in ("rloo", "reinforce_pp", "remax"):
        assert "actor/reward_kl_penalty" in rows[-1]


def test_vapo_value_pretraining_freezes_policy_and_fits_values(tiny_model_dir, arith_data, tmp_path):
    initial, batches = {}, []

    def watch(trainer):
        """Keep the untrained critic's weights and every batch the critic is updated on."""
        initial.update({k: v.detach().clone() for k, v in trainer.critic_model.state_dict().items()})
        update = trainer.critic.update
        trainer.critic.update = lambda batch: (batches.append(batch), update(batch))[1]

    trainer, before, _ = _run("vapo", tiny_model_dir, arith_data, tmp_path, before_fit=watch,
                              **{"algorithm.value_pretrain_steps": 4, "trainer.total_steps": 4,
                                 "critic.lr": 3e-3, "critic.ppo_epochs": 2})
    assert not _changed(trainer, before), "value pretraining must not touch the policy"
    assert len(batches) == 4 and (tmp_path / "critic_pretrained" / "config.json").exists()
    # A following run starts its critic from the pretrained one, head included.
    from reinforge.models.loading import load_critic

    critic = load_critic(str(tmp_path / "critic_pretrained"))
    assert torch.equal(critic.score.weight, trainer.critic_model.score.weight)
    # The critic fitted its targets: on the batch of its last update its values are closer to
    # the returns than the untrained critic's. (The logged vf_loss of step 4 vs step 1 compares
    # different batches: it falls with a learning rate of 0 too.)
    fitted = _value_error(trainer.critic, batches[-1])
    trainer.critic_model.load_state_dict(initial)
    untrained = _value_error(trainer.critic, batches[-1])
    assert fitted < untrained, (fitted, untrained)  # measured: 0.026 vs 0.031


def _value_error(critic, batch: Batch) -> float:
    """Mean squared error of the critic's values against the batch's returns, over response tokens."""
    m = batch["response_mask"].float()
    return float((((critic.values(batch)["values"] - batch["returns"]) ** 2) * m).sum() / m.sum())


def test_vapo_trains_after_pretraining(tiny_model_dir, arith_data, tmp_path):
    trainer, before, rows = _run("vapo", tiny_model_dir, arith_data, tmp_path,
                                 **{"algorithm.value_pretrain_steps": 1, "trainer.total_steps": 2})
    assert _changed(trainer, before)
    assert "actor/pg_loss" in rows[-1] and "actor/pg_loss" not in rows[0]


def test_dynamic_sampling_refills_across_rounds():
    """Groups 0 and 2 are informative, 1 is not: the filter keeps exactly rows of 0 and 2."""
    batch = Batch({"seq_scores": torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0]),
                   "group_ids": torch.tensor([0, 0, 1, 1, 2, 2])})
    kept, seen, n_kept = stages.keep_informative_groups(batch)
    assert (seen, n_kept) == (3, 2) and kept["group_ids"].tolist() == [0, 0, 2, 2]


def test_overlong_filter_masks_truncated_responses():
    batch = Batch({"response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]), "truncated": torch.tensor([True, False])})
    out, m = stages.overlong_filter(batch)
    assert out["loss_mask"].tolist() == [[0, 0, 0], [1, 1, 0]] and m["overlong/filtered_frac"] == 0.5
