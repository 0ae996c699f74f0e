"""The issue-16 advantage estimators inside a real RL step on the tiny model (1 step each).

The estimator's output in the step is recorded and its mechanism checked: pass@k credits at
most one response per group, GPG's sequence advantages sum to zero in each group, the optimal
token baseline receives the actor's pi and sum pi^2 of the rollout's distribution.
"""

import copy
import json
import math

import pytest
import torch

from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from reinforge.trainers import stages
from reinforge.trainers.rl import RLTrainer
from tests.conftest import rl_overrides


def _per_group(adv, mask, group_ids):
    """-> list of (n,) sequence advantages (first valid token's value), one per group."""
    seq = torch.where(mask.bool().any(-1), adv.gather(1, mask.argmax(-1, keepdim=True)).squeeze(1), 0.0)
    return [seq[group_ids == g] for g in group_ids.unique()]


@pytest.mark.parametrize("name", ["grpo_passk", "gpg"])
def test_estimator_runs_in_a_step(name, tiny_model_dir, arith_data, tmp_path, monkeypatch):
    seen = []
    real = stages.compute_advantages

    def record(est, inp):
        out = real(est, inp)
        seen.append((est, out[0], inp.response_mask, inp.group_ids))
        return out

    monkeypatch.setattr(stages, "compute_advantages", record)
    extra = {"algorithm.adv_estimator": name, "trainer.total_steps": 1, "trainer.val_every": 0,
             "trainer.export_hf": False, "rollout.max_response_length": 8}
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / name), **extra))
    RLTrainer(cfg).fit()
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r["step"] == 1][-1]
    assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
    (est, adv, mask, gids), = seen
    assert est == name and torch.all(adv[mask == 0] == 0) and adv.abs().sum() > 0  # some group had a signal
    for seq in _per_group(adv, mask, gids):
        if name == "grpo_passk":
            assert int((seq != 0).sum()) <= 1 and torch.all(seq >= 0)
        else:
            assert abs(float(seq.sum())) < 1e-5


def test_optimal_token_baseline_runs_in_a_step(tiny_model_dir, arith_data, tmp_path, monkeypatch):
    """The step hands the estimator the actor's pi and sum pi^2, equal to a direct softmax of the
    model's logits at the rollout's temperature, and the update runs."""
    seen = []
    real = stages.advantages_stage
    monkeypatch.setattr(stages, "advantages_stage", lambda batch, *a, **k: seen.append(batch) or real(batch, *a, **k))
    extra = {"algorithm.adv_estimator": "optimal_token_baseline", "trainer.total_steps": 1, "trainer.val_every": 0,
             "trainer.export_hf": False, "rollout.temperature": 0.7}
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "otb"), **extra))
    trainer = RLTrainer(cfg)
    model = copy.deepcopy(trainer.actor_model).eval()  # the rollout weights, before the update
    trainer.fit()
    rows = [json.loads(x) for x in (tmp_path / "otb" / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite([r for r in rows if r["step"] == 1][-1]["actor/pg_loss"])
    (batch,) = seen
    am, T = batch["attention_mask"], batch["responses"].shape[1]
    with torch.no_grad():
        z = model(input_ids=batch["input_ids"], attention_mask=am,
                  position_ids=(am.long().cumsum(-1) - 1).clamp(min=0)).logits[:, -T - 1:-1].float() / 0.7
    pi = z.softmax(-1)  # (B, T, V)
    m = batch["response_mask"].bool()
    torch.testing.assert_close(batch["sum_pi_squared"][m], (pi**2).sum(-1)[m], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(batch["old_log_probs"][m], pi.log().gather(-1, batch["responses"][..., None])[..., 0][m],
                               rtol=1e-4, atol=1e-5)
