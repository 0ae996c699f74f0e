import subprocess
import sys
from dataclasses import fields

import pytest

from reinforge.config.common import RunConfig
from reinforge.config.load import ConfigError, list_presets, load_config
from reinforge.config.preference import DPOConfig, RMConfig, validate_preference
from reinforge.config.schema import RLConfig, TrainerConfig
from reinforge.config.sft import SFTConfig, validate_sft
from reinforge.config.validate import validate
from tests.conftest import rl_overrides


RL_PRESETS = ["ppo", "grpo", "dapo", "gspo", "drgrpo", "vapo", "rloo", "reinforce_pp", "reinforce_pp_baseline",
              "remax", "demo_grpo"]


def test_rl_presets_load():
    assert set(RL_PRESETS) <= set(list_presets())
    for name in RL_PRESETS:
        assert isinstance(load_config(RLConfig, name), RLConfig)


def test_overrides_and_types():
    cfg = load_config(RLConfig, "grpo", ["rollout.n=4", "actor.lr=3e-4", "data.train_files=[a.parquet]"])
    assert cfg.rollout.n == 4 and cfg.actor.lr == pytest.approx(3e-4) and cfg.data.train_files == ["a.parquet"]
    with pytest.raises(ConfigError, match="did you mean 'rollout.n'"):
        load_config(RLConfig, "grpo", ["rollout.nn=4"])
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config(RLConfig, "grpo", ["rollout.n=lots"])
    with pytest.raises(ConfigError, match="neither a YAML file nor a preset"):
        load_config(RLConfig, "no_such_preset")


@pytest.mark.parametrize("extra,match", [
    ({"actor.mini_batch_size": 3}, "actor.mini_batch_size=3 must divide"),
    ({"actor.mini_batch_size": 8, "actor.micro_batch_size": 3}, "actor.micro_batch_size=3 must divide"),
    ({"rollout.n": 1}, "rollout.n=1 must be >= 2"),
    ({"rollout.max_response_length": 1000}, "exceeds the model's max_position_embeddings"),
    ({"algorithm.adv_estimator": "nope"}, "algorithm.adv_estimator='nope' is not known; valid"),
    ({"actor.loss_agg_mode": "mean"}, "actor.loss_agg_mode"),
    ({"model.path": "/nonexistent"}, "no such folder"),
    ({"data.train_files": "[]"}, "data.train_files is empty"),
    ({"data.train_files": "[/nonexistent.parquet]"}, "does not exist"),
])
def test_validation_messages(tiny_model_dir, arith_data, tmp_path, extra, match):
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **extra))
    with pytest.raises(ConfigError, match=match):
        validate(cfg)


def test_vllm_without_gpu_fails_at_config_time(tiny_model_dir, arith_data, tmp_path):
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path),
                                                     **{"rollout.backend": "vllm", "trainer.device": "cpu"}))
    with pytest.raises(ConfigError, match="vllm"):
        validate(cfg)


def test_derived(tiny_model_dir, arith_data, tmp_path):
    cfg = validate(load_config(RLConfig, "ppo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **{"rollout.n": 2})))
    assert cfg.derived["critic_enabled"] and cfg.derived["reference_enabled"] and cfg.derived["batch_size"] == 8


def test_every_preset_is_a_config():
    """Each listed preset loads into one of the schemas (the demo's task settings are not a preset)."""
    assert "demo_task" not in list_presets()
    for name in list_presets():
        loaded = []
        for schema in (RLConfig, SFTConfig, DPOConfig, RMConfig):
            try:
                loaded.append(load_config(schema, name))
            except ConfigError:
                pass
        assert loaded, name


def test_trainer_section_extends_run_section():
    assert issubclass(TrainerConfig, RunConfig)
    t, run = TrainerConfig(), RunConfig()
    assert t.run_dir == "runs/default"
    assert {f.name for f in fields(RunConfig)} < {f.name for f in fields(TrainerConfig)}
    assert all(getattr(t, f.name) == getattr(run, f.name) for f in fields(RunConfig) if f.name != "run_dir")
    with pytest.raises(ConfigError, match="did you mean 'trainer.run_dir'"):
        load_config(RLConfig, "grpo", ["trainer.rundir=x"])


def test_section_given_a_scalar():
    with pytest.raises(ConfigError, match="'actor' is a section"):
        load_config(RLConfig, "grpo", ["actor=3"])


@pytest.mark.parametrize("preset,key", [("grpo", "actor"), ("ppo", "actor"), ("ppo", "critic")])
def test_rl_lr_schedule_checked(tiny_model_dir, arith_data, tmp_path, preset, key):
    extra = {f"{key}.lr_schedule": "cosinus", "rollout.n": 2, "trainer.device": "cpu"}
    cfg = load_config(RLConfig, preset, rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **extra))
    with pytest.raises(ConfigError, match=f"{key}.lr_schedule='cosinus': constant, cosine or linear"):
        validate(cfg)


@pytest.mark.parametrize("schema,data,extra,match", [
    (SFTConfig, "sft", "optim.lr_schedule=cosinus", "optim.lr_schedule='cosinus': constant, cosine or linear"),
    (SFTConfig, "sft", "data.overlong=truncate_left", "data.overlong='truncate_left': error, skip or truncate_right"),
    (SFTConfig, "sft", "data.max_length=1", "data.max_length=1 must be > 1"),
    (SFTConfig, "sft", "data.train_files=[]", "data.train_files is empty: give at least one parquet/JSONL file"),
    (DPOConfig, "prefs", "optim.lr_schedule=cosinus", "optim.lr_schedule='cosinus': constant, cosine or linear"),
    (DPOConfig, "prefs", "data.overlong=truncate_right", "data.overlong='truncate_right': error or skip"),
    (DPOConfig, "prefs", "dpo.loss_type=nope", r"dpo.loss_type='nope' is not known; valid: \['sigmoid', 'ipo', 'hinge'\]"),
    (RMConfig, "prefs", "optim.micro_batch_size=0", "data.batch_size and optim.micro_batch_size must be > 0"),
    (RMConfig, "prefs", "data.train_files=[]", "give at least one prompt/chosen/rejected file"),
])
def test_supervised_validation_messages(tiny_model_dir, arith_data, schema, data, extra, match):
    cfg = load_config(schema, None, [f"model.path={tiny_model_dir}", f"data.train_files=[{arith_data[data]}]",
                                     "trainer.device=cpu", extra])
    check = validate_sft if schema is SFTConfig else validate_preference
    with pytest.raises(ConfigError, match=match):
        check(cfg)


@pytest.mark.parametrize("schema,data", [(SFTConfig, "sft"), (DPOConfig, "prefs"), (RMConfig, "prefs")])
def test_supervised_derived(tiny_model_dir, arith_data, schema, data):
    cfg = load_config(schema, None, [f"model.path={tiny_model_dir}", f"data.train_files=[{arith_data[data]}]",
                                     "trainer.device=cpu", "data.batch_size=8", "optim.micro_batch_size=16",
                                     "optim.epochs=2"])
    check = validate_sft if schema is SFTConfig else validate_preference
    check(cfg, 100)
    assert cfg.derived == {"device": "cpu", "micro_batch_size": 8, "total_steps": 25}


def test_config_import_does_not_load_torch():
    code = ("import sys, reinforge.config.validate, reinforge.config.sft, reinforge.config.preference; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("key", ["actor.kl_loss_type", "algorithm.kl_penalty"])
def test_full_kl_refused_for_training(tiny_model_dir, arith_data, tmp_path, key):
    """'full' is an algos estimator over (B, T, V) rows; the trainer only has (B, T) log-probs."""
    from reinforge.config.schema import RLConfig
    from reinforge.config.validate import validate
    from tests.conftest import rl_overrides

    cfg = load_config(RLConfig, "ppo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **{key: "full"}))
    with pytest.raises(ConfigError, match=f"{key}='full' needs log-probs over the whole vocabulary"):
        validate(cfg)
