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


# ---- KTO -------------------------------------------------------------------------------------

def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_kto_by_hand():
    from reinforge.algos.preference import kto_loss, kto_reference_point

    policy, ref = torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.5, -1.5, -2.0])  # r = [0.5, -0.5, -1.0]
    labels = torch.tensor([True, False, True])
    loss, m = kto_loss(policy, ref, labels, torch.tensor(0.2), beta=0.5, desirable_weight=1.0, undesirable_weight=2.0)
    # desirable: 1 - sigma(beta (r - z0)); undesirable: w_U (1 - sigma(beta (z0 - r))).
    expected = ((1 - sigmoid(0.5 * 0.3)) + 2 * (1 - sigmoid(0.5 * 0.7)) + (1 - sigmoid(0.5 * -1.2))) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["rewards/chosen"].item() == pytest.approx(0.5 * (0.5 - 1.0) / 2)
    assert m["rewards/rejected"].item() == pytest.approx(0.5 * -0.5)
    assert m["kl"].item() == pytest.approx(0.2)
    # z0 = max(0, mean log-ratio): [0.5, -1.0] -> 0 (clamped); [1.0, 0.0] -> 0.5.
    assert kto_reference_point(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])).item() == 0.0
    assert kto_reference_point(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.0])).item() == 0.5


def test_kto_mismatched_pairs_are_trl_s_cycle():
    from reinforge.algos.preference import kto_mismatched_index, kto_reference_point

    # TRL: KL_completion_ids = [y_{n-1}, y_0, ..., y_{n-2}]: prompt i meets completion i - 1.
    assert kto_mismatched_index(4) == [3, 0, 1, 2]
    assert kto_mismatched_index(2) == [1, 0]
    # Log-ratios pi - ref of prompt i with completion j, by hand: LR[i][j].
    LR = [[0.0, 0.4, -0.2, 1.0],
          [0.8, 0.0, 0.6, -1.0],
          [0.3, 0.1, 0.0, 0.5],
          [-0.4, 0.2, 1.2, 0.0]]
    idx = kto_mismatched_index(4)
    pol = torch.tensor([LR[i][j] for i, j in enumerate(idx)], dtype=torch.float64)  # ref = 0
    z0 = kto_reference_point(pol, torch.zeros(4, dtype=torch.float64))
    assert z0.item() == pytest.approx((1.0 + 0.8 + 0.1 + 1.2) / 4, abs=1e-12)  # 0.775
    # the i + 1 cycle would read [0.4, 0.6, 0.5, -0.4]: mean 0.275


def test_kto_weights_in_the_log_probs_dtype():
    from reinforge.algos.preference import kto_loss

    policy = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.5], dtype=torch.float64)  # r = [0.5, -0.5]
    loss, _ = kto_loss(policy, ref, torch.tensor([True, False]), torch.tensor(0.0, dtype=torch.float64), beta=0.1,
                       desirable_weight=0.1, undesirable_weight=0.3)
    # 0.1 and 0.3 as fp64 (an fp32 weight cast up is 0.10000000149...: off by 1.5e-9 relative)
    expected = (0.1 * (1 - sigmoid(0.1 * 0.5)) + 0.3 * (1 - sigmoid(0.1 * 0.5))) / 2
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(expected, rel=1e-14)


def test_kto_reference_point_carries_no_gradient():
    from reinforge.algos.preference import kto_loss, kto_reference_point

    policy = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-2.0, -2.5], dtype=torch.float64)
    kl = kto_reference_point(policy, ref)  # 0.75, from the same tensor the loss differentiates
    loss, _ = kto_loss(policy, ref, torch.tensor([True, False]), kl, beta=0.1)
    loss.backward()
    # d/dp (1 - sigma(b x)) = -b s (1 - s), x = r - z0 (desirable) or z0 - r (undesirable, sign flips).
    s0, s1 = sigmoid(0.1 * (1.0 - 0.75)), sigmoid(0.1 * (0.75 - 0.5))
    expected = [-0.1 * s0 * (1 - s0) / 2, 0.1 * s1 * (1 - s1) / 2]
    assert policy.grad.tolist() == pytest.approx(expected, rel=1e-9)


def test_unpaired_dataset_reads_both_schemas(tiny_model_dir, tmp_path):
    from reinforge.data import write_rows
    from reinforge.data.io import DataError
    from reinforge.data.preference import UnpairedPreferenceDataset
    from reinforge.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    unpaired = write_rows([{"prompt": "1+1=", "completion": "2", "label": True},
                           {"prompt": "1+1=", "completion": "3", "label": False}], str(tmp_path / "u.jsonl"))
    items = UnpairedPreferenceDataset(unpaired, tok, max_length=16).items
    assert [it["label"] for it in items] == [True, False]
    assert items[0]["completion_ids"][-1] == tok.eos_token_id
    paired = write_rows([{"prompt": "1+1=", "chosen": "2", "rejected": "3"}], str(tmp_path / "p.jsonl"))
    items = UnpairedPreferenceDataset(paired, tok, max_length=16).items
    assert [(tok.decode(it["completion_ids"][:-1]), it["label"]) for it in items] == [("2", True), ("3", False)]
    bad = write_rows([{"prompt": "1+1=", "completion": "2", "label": "yes"}], str(tmp_path / "b.jsonl"))
    with pytest.raises(DataError, match=r"b.jsonl: row 0: field 'label': 'yes' is not a boolean"):
        UnpairedPreferenceDataset(bad, tok, max_length=16)


@pytest.fixture(scope="module")
def unpaired_prefs(arith_data, tmp_path_factory) -> str:
    """The arithmetic task's first 8 pairs as 16 labelled completions (TRL's unpaired schema)."""
    from reinforge.data import load_rows, write_rows

    rows = [{"prompt": r["prompt"], "completion": r[key], "label": key == "chosen"}
            for r in load_rows(arith_data["prefs"])[:8] for key in ("chosen", "rejected")]
    return write_rows(rows, str(tmp_path_factory.mktemp("kto") / "unpaired.parquet"))


def test_kto_preset_end_to_end(tiny_model_dir, unpaired_prefs, tmp_path):
    trainer = DPOTrainer(load_config(DPOConfig, "kto", _overrides(tiny_model_dir, unpaired_prefs, tmp_path)))
    assert trainer.reference is not None and len(trainer.train) == 16
    final = trainer.fit()
    assert math.isfinite(final["loss"]) and final["grad_norm"] > 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in rows if r.get("step") == 1 and "loss" in r][0]
    # Step 1: policy == reference, so r = 0 and z0 = 0: every completion's loss is 1 - sigma(0).
    assert first["kl"] == 0.0 and first["loss"] == pytest.approx(0.5, abs=1e-6)
    assert 0 < first["desirable_fraction"] < 1
    assert final["kl"] >= 0.0


def test_kto_kl_uses_mismatched_pairs_and_accumulates_exactly(tiny_model_dir, unpaired_prefs, tmp_path):
    from reinforge.trainers.dpo import policy_sequence_logps
    from reinforge.trainers.preference_common import unpaired_tensors

    trainer = DPOTrainer(load_config(DPOConfig, "kto", _overrides(tiny_model_dir, unpaired_prefs, tmp_path)))
    torch.manual_seed(7)  # a draw under which the mismatched pairs' mean log-ratio is +0.49, not clamped
    with torch.no_grad():  # move the reference off the policy so z0 and the log-ratios are not 0
        for p in trainer.reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    items = [trainer.train[i] for i in range(8)]

    def mean_log_ratio(shift: int) -> float:  # prompt i scored with the completion of item i + shift (mod 8)
        shifted = [{"prompt_ids": items[i]["prompt_ids"], "completion_ids": items[(i + shift) % 8]["completion_ids"]}
                   for i in range(8)]
        batch = unpaired_tensors(shifted, trainer.pad_id, trainer.device)
        with torch.no_grad():
            return (policy_sequence_logps(trainer.model, batch, trainer.cfg.model, "sum")
                    - policy_sequence_logps(trainer.reference, batch, trainer.cfg.model, "sum")).mean().item()

    kl = trainer.kl_reference_point(items)
    expected = mean_log_ratio(-1)  # TRL's pairing: completion i - 1
    assert expected > 0.05  # the clamp at 0 is not what is tested here
    assert kl.item() == pytest.approx(expected, abs=1e-5)
    assert abs(mean_log_ratio(+1) - expected) > 1e-3  # the other cycle would give another z0

    def grads(micro: int) -> torch.Tensor:  # one step's gradient with micro-batches of `micro`
        trainer.model.zero_grad()
        state = trainer.batch_state(items)
        for start in range(0, 8, micro):
            loss, _ = trainer.pair_loss(items[start:start + micro], **state)
            (loss * micro / 8).backward()
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters()])

    whole, split = grads(8), grads(2)
    # relative to the gradient's largest entry (summation order differs by CPU and thread count)
    gap = (whole - split).abs().max() / whole.abs().max()
    assert gap <= 1e-5, gap


def test_kto_rejects_precomputed_reference(tiny_model_dir, unpaired_prefs, tmp_path, capsys):
    from reinforge.cli.main import main

    rc = main(["dpo", "--config", "kto", *_overrides(tiny_model_dir, unpaired_prefs, tmp_path),
               "dpo.precompute_ref=true"])
    err = capsys.readouterr().err
    assert rc == 2 and "dpo.loss_type=kto scores the reference on each batch's mismatched pairs" in err, err
