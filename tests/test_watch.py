"""Runs people can watch (issue 12 part 5): validation progress and an ETA that counts it,
greedy-only validation between steps, training samples every k steps, veRL's validation metric
names beside the short aliases, and project / experiment names for wandb and MLflow."""
from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest

from reinforge.trainers.logging import Eta, RunLogger, run_names, samples_due
from reinforge.trainers.run_dir import rewind
from reinforge.trainers.validation import verl_names
from tests.conftest import rl_overrides


def test_verl_names_hand_computed():
    # Two prompts, greedy acc 1 / 0; four samples each: prompt 0 right twice, prompt 1 never.
    m = verl_names("arith", [1.0, 0.0], [1.0, 0.5], [[1, 0, 0, 1], [0, 0, 0, 0]],
                   [[1.0, 0.2, 0.2, 1.0], [0.0, 0.0, 0.0, 0.0]], pass_k=[1, 2, 8])
    core = "val-core/arith/acc"
    assert m[f"{core}/mean@1"] == 0.5 and m["val-aux/arith/reward/mean@1"] == 0.75
    assert m[f"{core}/mean@4"] == 0.25 and m[f"{core}/best@4/mean"] == 0.5 and m[f"{core}/worst@4/mean"] == 0.0
    assert m["val-aux/arith/acc/std@4"] == 0.25  # population std of [1, 0, 0, 1] is 0.5; of zeros 0
    assert m[f"{core}/pass@1"] == 0.25
    assert m[f"{core}/pass@2"] == pytest.approx((1 - 1 / 6) / 2)  # 1 - C(2,2)/C(4,2) for prompt 0
    assert f"{core}/pass@8" not in m  # k > n: not estimable
    assert m["val-aux/arith/reward/mean@4"] == pytest.approx(0.3) and m["val-aux/arith/reward/best@4/mean"] == 0.5
    assert not any("reward/pass@" in k for k in m)
    # Greedy only (between steps), and n = 1 sampled: mean@1 is the greedy accuracy, never overwritten.
    assert set(verl_names("a", [1.0], [1.0], None, None, [1])) == {"val-core/a/acc/mean@1", "val-aux/a/reward/mean@1"}
    assert verl_names("a", [1.0], [1.0], [[0.0]], [[0.0]], [1])["val-core/a/acc/mean@1"] == 1.0


def test_eta_counts_the_validations_to_come():
    eta = Eta({5: "greedy", 10: "sampled"}, total_steps=10, sampled_cost=5.0)
    assert eta.seconds_left(0) is None  # no step timed yet
    eta.record_val("greedy", 3.0)
    eta.record_step(1.0)
    eta.record_step(3.0)
    # 8 steps at 2 s, the greedy validation at step 5 (3 s), the sampled one at 10 estimated as 5 x 3 s
    assert eta.seconds_left(2) == 8 * 2.0 + 3.0 + 15.0
    eta.record_val("sampled", 10.0)
    assert eta.seconds_left(5) == 5 * 2.0 + 10.0  # step 5's validation is done
    assert eta.seconds_left(10) == 0.0


def test_samples_due():
    assert [s for s in range(1, 31) if samples_due(10, s)] == [1, 10, 20, 30]
    assert not any(samples_due(0, s) for s in range(1, 31))


def test_run_names(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert run_names(None, None, tmp_path / "ppo_lr3") == ("reinforge", "ppo_lr3")
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert run_names(None, "exp1", tmp_path) == ("from-env", "exp1")
    assert run_names("mine", None, tmp_path / "r")[0] == "mine"  # the config wins over the variable


def _fake_module(name: str, calls: list) -> types.ModuleType:
    """A stand-in for wandb / mlflow that records every call (neither is installed in the venv)."""
    mod = types.ModuleType(name)
    mod.__getattr__ = lambda attr: (lambda *a, **k: calls.append((attr, a, k)))
    return mod


def test_wandb_and_mlflow_get_project_and_experiment(monkeypatch, tmp_path):
    wandb, mlflow = [], []
    monkeypatch.setitem(sys.modules, "wandb", _fake_module("wandb", wandb))
    monkeypatch.setitem(sys.modules, "mlflow", _fake_module("mlflow", mlflow))
    monkeypatch.setenv("WANDB_PROJECT", "env-project")
    log = RunLogger(tmp_path / "run_a", ["wandb", "mlflow"], 3, config={"x": 1})
    log.close()
    init = next(k for name, _, k in wandb if name == "init")
    assert init["project"] == "env-project" and init["name"] == "run_a"
    assert "set_experiment" not in [c[0] for c in mlflow]  # MLflow keeps its own default experiment
    assert next(k for name, _, k in mlflow if name == "start_run") == {"run_name": "run_a"}
    wandb.clear(), mlflow.clear()
    log = RunLogger(tmp_path / "run_b", ["wandb", "mlflow"], 3, project_name="proj", experiment_name="exp")
    log.close()
    assert next(k for name, _, k in wandb if name == "init")["project"] == "proj"
    assert ("set_experiment", ("proj",), {}) in mlflow
    assert next(k for name, _, k in mlflow if name == "start_run") == {"run_name": "exp"}


def test_validation_bar_and_eta_on_the_console(tmp_path, capsys):
    log = RunLogger(tmp_path, ["console"], 4, progress=True)
    with log.val_progress(6, "3 prompts x (1 greedy + 1 sampled)") as update:
        update(3)
        update(3)
    log.set_eta(75.0)
    log.advance()
    log.close()
    err = capsys.readouterr().err
    assert "validation:" in err and "0/6 [" in err and "3 prompts x" in err  # a second bar, in sequences
    assert "<01:15" in err  # the ETA given, not tqdm's extrapolation
    log = RunLogger(tmp_path, ["console"], 4, progress=False)
    with log.val_progress(6, "3 prompts x (1 greedy)"):
        pass
    log.set_eta(75.0)
    log.log(1, {"val/acc_greedy": 0.5})
    log.close()
    err = capsys.readouterr().err
    assert "validating: 3 prompts x (1 greedy)" in err and "step 1/4 (eta 01:15)" in err


def test_rewind_drops_train_samples_after_the_checkpoint(tmp_path):
    samples = tmp_path / "samples"
    samples.mkdir()
    for name in ("step_0", "step_2", "step_4", "train_step_1", "train_step_2", "train_step_3", "notes"):
        (samples / f"{name}.jsonl").write_text("{}\n")
    rewind(tmp_path, 2)
    assert sorted(p.stem for p in samples.iterdir()) == ["notes", "step_0", "step_2", "train_step_1", "train_step_2"]


def test_rl_run_greedy_between_steps_sampled_at_the_end(tiny_model_dir, arith_data, tmp_path, capsys):
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    run = tmp_path / "run"
    cfg = load_config(RLConfig, "grpo", rl_overrides(
        tiny_model_dir, arith_data, str(run), **{"trainer.total_steps": 3, "trainer.val_every": 1,
                                                 "trainer.log_samples_every": 2, "trainer.loggers": "[jsonl,console]",
                                                 "trainer.export_hf": False}))
    assert cfg.trainer.val_sampled == "end" and cfg.trainer.val_before_train
    RLTrainer(cfg).fit()
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2, 3]
    for step in (0, 1, 2):  # greedy only: no sampled metric, under either name
        assert "val/acc_greedy" in rows[step] and "val-core/arithmetic/acc/mean@1" in rows[step]
        assert not [k for k in rows[step] if "sampled" in k or "pass@" in k or "@2" in k], step
    last = rows[3]
    assert last["val-core/arithmetic/acc/mean@2"] == last["val/acc_sampled"]  # rollout.val_n=2, one source
    assert last["val-core/arithmetic/acc/pass@2"] == last["val/pass@2"]
    assert last["val-core/arithmetic/acc/mean@1"] == last["val/acc_greedy"]
    assert sorted(p.name for p in (run / "samples").glob("train_*")) == ["train_step_1.jsonl", "train_step_2.jsonl"]
    samples = [json.loads(x) for x in (run / "samples" / "train_step_2.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 4  # data.train_batch_size=4 groups of rollout.n=4, under the caps (8 x 4)
    for g in {s["group"] for s in samples}:
        group = [s for s in samples if s["group"] == g]
        assert len({s["prompt"] for s in group}) == 1 and len(group) == 4
        # GRPO: each response's advantage is its group-normalised reward, summing to 0 over the group.
        assert abs(sum(s["advantage"] for s in group)) < 1e-4
    for s in samples:
        assert s["reward"] == pytest.approx(s["score"])  # no KL in the reward
        assert isinstance(s["response"], str) and s["response_length"] >= 0 and math.isfinite(s["advantage"])
        assert s["rewards"] == {"digit_fraction": pytest.approx(s["score"])}  # the one function, weight 1
    err = capsys.readouterr().err
    assert "validating: 8 prompts x (1 greedy)" in err and "validating: 8 prompts x (1 greedy + 2 sampled)" in err
    assert "step 3/3 (eta 00:00)" in err


def test_val_sampled_is_checked_with_the_config(tiny_model_dir, arith_data, tmp_path):
    from reinforge.config.load import ConfigError, load_config
    from reinforge.config.schema import RLConfig
    from reinforge.config.validate import validate

    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path),
                                                     **{"trainer.val_sampled": "sometimes"}))
    with pytest.raises(ConfigError, match=r"trainer.val_sampled='sometimes': end, always or never"):
        validate(cfg)
