"""TRL's preference family beyond DPO: SimPO, CPO and ORPO (reference-free), each loss against
hand-computed values, ORPO's gradient against its derivative, and each preset end to end on the
tiny model with no reference model built."""
from __future__ import annotations

import json
import math

import pytest
import torch

from reinforge.algos.preference import reference_free_loss
from reinforge.config.load import load_config
from reinforge.config.preference import DPOConfig
from reinforge.trainers import dpo as dpo_module
from reinforge.trainers.dpo import DPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread

CHOSEN, REJECTED = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])  # (B,) sequence log-probs


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))  # -log sigma(-x)


def test_simpo_by_hand():
    # d = [1, -1]; beta d - gamma = [2 - 1, -2 - 1] = [1, -3]; -log sigma(t) = softplus(-t).
    loss, m = reference_free_loss(CHOSEN, REJECTED, "simpo", beta=2.0, simpo_gamma=1.0)
    assert loss.item() == pytest.approx((softplus(-1) + softplus(3)) / 2, abs=1e-6)
    assert m["rewards/chosen"].item() == pytest.approx(2.0 * -1.5)  # beta x policy log-prob, no reference
    assert m["rewards/accuracies"].item() == 0.5 and m["rewards/margins"].item() == pytest.approx(0.0)


def test_cpo_by_hand():
    # beta d = [0.1, -0.1], no margin.
    loss, _ = reference_free_loss(CHOSEN, REJECTED, "cpo", beta=0.1)
    assert loss.item() == pytest.approx((softplus(-0.1) + softplus(0.1)) / 2, abs=1e-6)


def test_orpo_by_hand():
    # log odds(p) = log p - log(1 - p) with log p = the token-mean log-prob.
    def log_odds(lp: float) -> float:
        return lp - math.log(1 - math.exp(lp))

    gaps = [log_odds(-1) - log_odds(-2), log_odds(-2) - log_odds(-1)]  # [1.5413, -1.5413]
    loss, m = reference_free_loss(CHOSEN, REJECTED, "orpo", beta=0.1)
    assert loss.item() == pytest.approx(sum(0.1 * softplus(-g) for g in gaps) / 2, abs=1e-6)
    assert m["log_odds_chosen"].item() == pytest.approx(0.0, abs=1e-6)
    assert m["log_odds_ratio"].item() == pytest.approx(-sum(softplus(-g) for g in gaps) / 2, abs=1e-6)


def test_orpo_gradient_and_near_one_likelihood():
    # d/dc [-beta log sigma(g)] = -beta sigma(-g) dg/dc, dg/dc = 1 + p/(1-p) = 1/(1 - e^c).
    c = torch.tensor([-0.5], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([-1.5], dtype=torch.float64)
    loss, _ = reference_free_loss(c, r, "orpo", beta=0.1)
    loss.backward()
    g = (-0.5 - math.log(1 - math.exp(-0.5))) - (-1.5 - math.log(1 - math.exp(-1.5)))
    expected = -0.1 * (1 / (1 + math.exp(g))) / (1 - math.exp(-0.5))
    assert c.grad.item() == pytest.approx(expected, rel=1e-9)
    # A likelihood within float32 rounding of 1 (log p = -1e-8): 1 - exp(log p) would be 0.
    near_one, _ = reference_free_loss(torch.tensor([-1e-8]), torch.tensor([-1.0]), "orpo", beta=0.1)
    assert math.isfinite(near_one.item())


def _overrides(model_dir: str, prefs: str, run_dir) -> list[str]:
    base = {"model.path": model_dir, "data.train_files": f"[{prefs}]", "data.val_fraction": 0.0,
            "data.max_length": 16, "data.batch_size": 8, "optim.micro_batch_size": 4, "trainer.total_steps": 2,
            "optim.lr": 3e-3, "trainer.run_dir": str(run_dir), "trainer.progress": False,
            "trainer.loggers": "[jsonl]", "trainer.val_before_train": False, "trainer.export_hf": False}
    return [f"{k}={v}" for k, v in base.items()]


@pytest.mark.parametrize("preset, extra_metric", [("simpo", None), ("cpo", "nll/chosen"),
                                                  ("orpo", "log_odds_ratio")])
def test_reference_free_presets_run_without_reference(preset, extra_metric, tiny_model_dir, arith_data, tmp_path,
                                                      monkeypatch):
    real_load = dpo_module.load_causal_lm

    def policy_only(path, train=True, **kw):
        assert train, f"{preset} built a reference model"
        return real_load(path, **kw)

    monkeypatch.setattr(dpo_module, "load_causal_lm", policy_only)
    trainer = DPOTrainer(load_config(DPOConfig, preset, _overrides(tiny_model_dir, arith_data["prefs"], tmp_path)))
    assert trainer.reference is None and trainer.ref_cache is None
    final = trainer.fit()
    assert math.isfinite(final["loss"]) and final["grad_norm"] > 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in rows if r.get("step") == 1 and "loss" in r][0]
    beta = trainer.cfg.dpo.beta
    # No reference: the implicit reward is beta x the policy's own log-prob.
    assert first["rewards/chosen"] == pytest.approx(beta * first["logps/chosen"], rel=1e-5)
    assert first["rewards/rejected"] == pytest.approx(beta * first["logps/rejected"], rel=1e-5)
    if extra_metric:
        assert extra_metric in first, first
    # softplus is convex, so mean_i softplus(gamma - beta d_i) >= softplus(gamma - rewards/margins).
    if preset == "simpo":  # no NLL term; the margin gamma = 1 shifts the bound
        assert "nll/chosen" not in first
        assert first["loss"] >= softplus(1.0 - first["rewards/margins"]) - 1e-6
    if preset == "cpo":  # sigmoid term + 1.0 x NLL
        assert first["loss"] >= softplus(-first["rewards/margins"]) + first["nll/chosen"] - 1e-6
    if preset == "orpo":  # exactly NLL - lambda x mean log sigma(log-odds gap)
        assert first["loss"] == pytest.approx(first["nll/chosen"] - 0.1 * first["log_odds_ratio"], rel=1e-5)


def test_reference_free_rejects_reference_keys(tiny_model_dir, arith_data, tmp_path, capsys):
    from reinforge.cli.main import main

    rc = main(["dpo", "--config", "simpo", *_overrides(tiny_model_dir, arith_data["prefs"], tmp_path),
               "dpo.precompute_ref=true"])
    err = capsys.readouterr().err
    assert rc == 2 and "dpo.loss_type=simpo uses no reference model" in err, err
