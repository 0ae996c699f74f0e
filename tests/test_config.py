import pytest

from reinforge.config.load import ConfigError, list_presets, load_config
from reinforge.config.schema import RLConfig
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
