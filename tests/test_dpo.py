"""DPO end to end on the tiny model: it learns the preference, the cached reference equals the
live one, every loss type runs, stop-and-resume equals an uninterrupted run, bad input fails
with a message naming file, row and field."""
from __future__ import annotations

import json
import math

import pytest
import torch

from reinforge.config.load import load_config
from reinforge.config.preference import DPOConfig
from reinforge.data import write_rows
from reinforge.trainers import dpo as dpo_module
from reinforge.trainers.dpo import DPOTrainer


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


def _overrides(model_dir: str, prefs: str, run_dir, **extra) -> list[str]:
    base = {"model.path": model_dir, "data.train_files": f"[{prefs}]", "data.val_fraction": 0.0,
            "data.max_length": 16, "data.batch_size": 8, "optim.micro_batch_size": 4, "trainer.total_steps": 3,
            "optim.lr": 3e-3, "dpo.beta": 0.5, "trainer.run_dir": str(run_dir), "trainer.progress": False,
            "trainer.loggers": "[jsonl]", "trainer.val_before_train": False, "trainer.export_hf": False}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture(scope="module")
def small_prefs(arith_data, tmp_path_factory) -> str:
    """16 pairs of the arithmetic task: a training set small enough to fit in a few steps."""
    from reinforge.data import load_rows

    rows = load_rows(arith_data["prefs"])[:16]
    return write_rows(rows, str(tmp_path_factory.mktemp("prefs") / "small.parquet"))


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dpo_learns_the_preference(tiny_model_dir, small_prefs, tmp_path):
    cfg = load_config(DPOConfig, "dpo", _overrides(tiny_model_dir, small_prefs, tmp_path, **{
        "trainer.total_steps": 12, "data.val_files": f"[{small_prefs}]", "trainer.export_hf": True}))
    trainer = DPOTrainer(cfg)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit()
    rows = _rows(tmp_path)
    train = [r for r in rows if "loss" in r]
    assert len(train) == 12 and all(math.isfinite(r["loss"]) for r in train)
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected",
                "grad_norm", "lr"):
        assert key in train[-1]
    assert train[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference at step 1
    final = rows[-1]
    assert final["val/rewards/accuracies"] > 0.8, final
    assert final["val/loss"] < math.log(2)
    assert (tmp_path / "hf" / "config.json").exists() and (tmp_path / "checkpoints" / "step_12").is_dir()


@pytest.mark.parametrize("reduction", ["auto", "mean"])  # the cache holds sums; means divide by the batch's counts
def test_cached_reference_equals_live(tiny_model_dir, small_prefs, tmp_path, monkeypatch, reduction):
    live = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(tiny_model_dir, small_prefs, tmp_path / "a", **{
        "dpo.reduction": reduction})))
    cached = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(
        tiny_model_dir, small_prefs, tmp_path / "b", **{"dpo.precompute_ref": True, "dpo.reduction": reduction})))
    assert cached.reference is None and (tmp_path / "b" / "ref_logps.pt").exists()
    # Move the policy away from the reference so the reference term matters.
    with torch.no_grad():
        for p1, p2 in zip(live.model.parameters(), cached.model.parameters()):
            noise = 0.05 * torch.randn_like(p1)
            p1.add_(noise)
            p2.add_(noise)
    items = [live.train[i] for i in (3, 0, 7, 12, 5)]
    loss_live, m_live = live.pair_loss(items)
    loss_cached, m_cached = cached.pair_loss(items)
    assert loss_live.item() != pytest.approx(math.log(2), abs=1e-4)
    assert loss_cached.item() == pytest.approx(loss_live.item(), abs=1e-5)
    for k in m_live:
        assert m_cached[k].item() == pytest.approx(m_live[k].item(), abs=1e-5)

    # A second run with the same data and reference reads the cache: no reference is loaded.
    real_load = dpo_module.load_causal_lm

    def load_policy_only(path, train=True, **kw):
        assert train, "reference loaded although its log-probs are cached"
        return real_load(path, **kw)

    monkeypatch.setattr(dpo_module, "load_causal_lm", load_policy_only)
    again = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(
        tiny_model_dir, small_prefs, tmp_path / "b", **{"dpo.precompute_ref": True, "dpo.reduction": reduction})))
    assert torch.equal(again.ref_cache["train"], cached.ref_cache["train"])


# At step 1 the policy is the reference, so z = 0 and (with beta = 0.5 from _overrides):
#   ipo (z - 1/(2 beta))^2 = 1/(4 beta^2) = 1;  hinge relu(1 - beta z) = 1;
#   sigmoid with label smoothing ls: -(1 - ls) log sigma(0) - ls log sigma(0) = log 2, plus
#   nll_coef x the chosen responses' mean per-token NLL (logged as nll/chosen);
#   robust (rDPO) with eps: ((1 - eps) log 2 - eps log 2) / (1 - 2 eps) = log 2.
@pytest.mark.parametrize("extra, step1_loss", [
    ({"dpo.loss_type": "ipo"}, lambda row: 1 / (4 * 0.5 ** 2)),
    ({"dpo.loss_type": "hinge"}, lambda row: 1.0),
    ({"dpo.loss_type": "robust", "dpo.label_smoothing": 0.2}, lambda row: math.log(2)),
    ({"dpo.reduction": "mean", "dpo.label_smoothing": 0.1, "dpo.nll_coef": 0.5},
     lambda row: math.log(2) + 0.5 * row["nll/chosen"]),
], ids=["ipo", "hinge", "robust", "sigmoid-mean-ls-nll"])
def test_loss_variants_run(tiny_model_dir, small_prefs, tmp_path, extra, step1_loss):
    trainer = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(
        tiny_model_dir, small_prefs, tmp_path, **{"trainer.total_steps": 2, **extra})))
    assert trainer.cfg.dpo.beta == 0.5
    final = trainer.fit()
    assert math.isfinite(final["loss"]) and final["grad_norm"] > 0
    first = [r for r in _rows(tmp_path) if r["step"] == 1][0]
    for key in ("rewards/margins", "rewards/chosen", "rewards/rejected"):  # policy == reference
        assert first[key] == pytest.approx(0.0, abs=1e-6), (key, first[key])
    if "dpo.nll_coef" in extra:
        assert first["nll/chosen"] > 0
    else:
        assert "nll/chosen" not in first
    assert first["loss"] == pytest.approx(step1_loss(first), abs=1e-5), first


def test_resume_equals_uninterrupted(tiny_model_dir, small_prefs, tmp_path):
    common = {"trainer.total_steps": 4, "trainer.save_every": 2, "dpo.precompute_ref": True}
    full = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(tiny_model_dir, small_prefs, tmp_path / "full", **common)))
    full.fit()
    # "Crash" after step 2: a run that stops there, then a fresh process resuming to step 4.
    part = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(
        tiny_model_dir, small_prefs, tmp_path / "part", **{**common, "trainer.total_steps": 2})))
    part.fit()
    resumed = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(tiny_model_dir, small_prefs, tmp_path / "part", **common)))
    resumed.fit(resume=True)
    assert resumed.step_idx == 4
    for (k, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), k
    last_full, last_part = _rows(tmp_path / "full")[-1], _rows(tmp_path / "part")[-1]
    assert last_part["step"] == 4 and last_part["loss"] == last_full["loss"]


@pytest.mark.parametrize("row, field, words", [
    ({"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "rejected", "identical"),
    ({"prompt": "1+1=", "chosen": " ", "rejected": "3"}, "chosen", "empty"),
    ({"prompt": "1+1=", "chosen": "2"}, "rejected", "missing"),
])
def test_bad_input_names_file_row_field(tiny_model_dir, tmp_path, capsys, row, field, words):
    from reinforge.cli.main import main

    good = {"prompt": "2+2=", "chosen": "4", "rejected": "5"}
    path = write_rows([good, good, row], str(tmp_path / "bad.jsonl"))
    rc = main(["dpo", *_overrides(tiny_model_dir, path, tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "bad.jsonl" in err and "row 2" in err and f"'{field}'" in err and words in err, err


def test_skipped_pairs_are_reported(tiny_model_dir, small_prefs, tmp_path, capsys):
    """Pairs dropped by data.overlong=skip are printed when the data loads and logged at step 0."""
    from reinforge.data import PreferenceDataset

    trainer = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(tiny_model_dir, small_prefs, tmp_path, **{
        "data.max_length": 6, "data.overlong": "skip", "data.batch_size": 4, "trainer.total_steps": 1})))
    skipped = PreferenceDataset(small_prefs, trainer.tok, max_length=6, overlong="skip").num_skipped
    assert 0 < skipped < 16 and len(trainer.train) == 16 - skipped
    out = capsys.readouterr().out
    assert f"skipped {skipped} training pairs longer than data.max_length=6 (data.overlong=skip)" in out, out
    trainer.fit()
    assert _rows(tmp_path)[0] == {"step": 0, "data/skipped_rows": float(skipped)}
    assert (tmp_path / "config.yaml").exists()


def test_cli_summary(tiny_model_dir, small_prefs, arith_data, tmp_path, capsys):
    """`reinforge dpo` prints one summary: the val/ metrics (pair metrics and prompt accuracy, not
    the per-data-source breakdown), the run directory and the exported model."""
    from reinforge.cli.main import main

    rc = main(["dpo", *_overrides(tiny_model_dir, small_prefs, tmp_path, **{
        "trainer.total_steps": 1, "data.val_files": f"[{small_prefs}]", "trainer.export_hf": True,
        "eval.prompt_files": f"[{arith_data['test']}]", "eval.reward_functions": "[{name: arithmetic}]",
        "eval.max_prompt_length": 8, "eval.max_response_length": 4})])
    out = capsys.readouterr().out
    assert rc == 0
    assert "val/rewards/accuracies=" in out and "val/loss=" in out and "val/acc_greedy=" in out, out
    assert "val/arithmetic/" not in out, out
    assert f"run directory: {tmp_path}" in out and f"model: {tmp_path / 'hf'}" in out, out
    assert list((tmp_path / "samples").glob("step_*.jsonl"))


# ---- dpo.reduction tied to the loss type; TRL's logged rewards --------------------------------

@pytest.mark.parametrize("preset, loss_type, resolved", [
    ("dpo", "sigmoid", "sum"), ("dpo", "robust", "sum"), ("dpo", "hinge", "sum"), ("dpo", "ipo", "mean"),
    ("dpo", "simpo", "mean"), ("dpo", "orpo", "mean"), ("dpo", "cpo", "sum"), ("dpo", "kto", "sum"),
    ("simpo", "simpo", "mean"), ("orpo", "orpo", "mean"), ("kto", "kto", "sum")])
def test_reduction_auto_follows_the_loss_type(tiny_model_dir, small_prefs, tmp_path, preset, loss_type, resolved):
    """`--config dpo dpo.loss_type=ipo` gets IPO's token means, not the base preset's sums; the
    run's config.yaml records the resolved value."""
    from reinforge.trainers.plan import plan_supervised

    cfg = load_config(DPOConfig, preset, _overrides(tiny_model_dir, small_prefs, tmp_path,
                                                     **{"dpo.loss_type": loss_type}))
    given = cfg.dpo.reduction  # auto from the dpo preset; the others spell theirs out
    assert given == "auto" or preset != "dpo"
    plan = plan_supervised(cfg)
    assert plan.cfg.dpo.reduction == resolved and plan.to_dict()["dpo"]["reduction"] == resolved
    assert cfg.dpo.reduction == given  # the loaded config is not changed


@pytest.mark.parametrize("loss_type, reduction, words", [
    ("simpo", "sum", "defined on mean log-probs: set dpo.reduction=auto (summed log-probs without a margin are "
                     "dpo.loss_type=cpo)"),
    ("cpo", "mean", "dpo.loss_type=simpo dpo.simpo_gamma=0"),
    ("orpo", "sum", "defined on mean log-probs"),
    ("kto", "mean", "defined on sum log-probs"),
    ("hinge", "mean", "defined on sum log-probs"),
    ("robust", "mean", "defined on sum log-probs"),
])
def test_reduction_without_published_meaning_is_refused(tiny_model_dir, small_prefs, tmp_path, loss_type, reduction,
                                                        words):
    from reinforge.config.load import ConfigError
    from reinforge.trainers.plan import plan_supervised

    cfg = load_config(DPOConfig, "dpo", _overrides(tiny_model_dir, small_prefs, tmp_path, **{
        "dpo.loss_type": loss_type, "dpo.reduction": reduction}))
    with pytest.raises(ConfigError, match=f"^dpo.reduction={reduction} has no published meaning with "
                                          f"dpo.loss_type={loss_type}") as e:
        plan_supervised(cfg)
    assert words in str(e.value)


@pytest.mark.parametrize("loss_type, reduction", [("sigmoid", "mean"), ("ipo", "sum")])
def test_reduction_both_published_forms_accepted(tiny_model_dir, small_prefs, tmp_path, loss_type, reduction):
    from reinforge.trainers.plan import plan_supervised

    cfg = load_config(DPOConfig, "dpo", _overrides(tiny_model_dir, small_prefs, tmp_path, **{
        "dpo.loss_type": loss_type, "dpo.reduction": reduction}))
    assert plan_supervised(cfg).cfg.dpo.reduction == reduction


# Token log-probs by hand (row b: pair b's chosen, row B + b: its rejected), 4 positions.
# Pair 0: chosen 1 token with log-ratio +0.1, rejected 4 tokens with +0.05 each:
#   token means: z = 0.1 - 0.05 = 0.05 > 0;  sums: 0.1 - 0.2 = -0.1 < 0 (the pair flips).
# Pair 1: chosen 2 tokens with +0.2, rejected 2 tokens with -0.1: z = 0.3 (means), 0.6 (sums).
_POLICY = [[-1.0, 0, 0, 0], [-0.3, -0.3, 0, 0], [-0.5, -0.5, -0.5, -0.5], [-0.6, -0.6, 0, 0]]
_RATIO = [[0.1, 0, 0, 0], [0.2, 0.2, 0, 0], [0.05, 0.05, 0.05, 0.05], [-0.1, -0.1, 0, 0]]
_MASK = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]


def test_logged_rewards_are_trl_s_sums_under_mean_reduction(tiny_model_dir, small_prefs, tmp_path, monkeypatch):
    trainer = DPOTrainer(load_config(DPOConfig, "dpo", _overrides(tiny_model_dir, small_prefs, tmp_path, **{
        "dpo.reduction": "mean"})))  # beta 0.5
    pol = torch.tensor(_POLICY, dtype=torch.float64)
    ref = pol - torch.tensor(_RATIO, dtype=torch.float64)
    mask = torch.tensor(_MASK, dtype=torch.float64)

    def by_hand(model, batch, model_cfg):
        return (ref if model is trainer.reference else pol), mask

    monkeypatch.setattr(dpo_module, "response_token_logps", by_hand)
    loss, m = trainer.pair_loss([trainer.train[0], trainer.train[1]])
    ls = lambda x: -math.log1p(math.exp(-x))  # log sigma(x)
    assert loss.item() == pytest.approx(-(ls(0.5 * 0.05) + ls(0.5 * 0.3)) / 2, abs=1e-12)  # the loss: means
    # the metrics: beta (sum pi - sum ref) and summed log-probs, as TRL's DPOTrainer logs them
    assert m["rewards/chosen"].item() == pytest.approx(0.5 * (0.1 + 0.4) / 2, abs=1e-12)
    assert m["rewards/rejected"].item() == pytest.approx(0.5 * (0.2 - 0.2) / 2, abs=1e-12)
    assert m["rewards/margins"].item() == pytest.approx(0.5 * (-0.1 + 0.6) / 2, abs=1e-12)
    assert m["rewards/accuracies"].item() == 0.5  # token means would give 1.0
    assert m["logps/chosen"].item() == pytest.approx((-1.0 - 0.6) / 2, abs=1e-12)
    assert m["logps/rejected"].item() == pytest.approx((-2.0 - 1.2) / 2, abs=1e-12)
