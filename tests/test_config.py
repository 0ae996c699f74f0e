import subprocess
import sys
from dataclasses import fields

import pytest

from reinforge.config.common import RunConfig
from reinforge.config.load import ConfigError, list_presets, load_config
from reinforge.config.preference import DPOConfig, RMConfig
from reinforge.config.schema import RLConfig, TrainerConfig
from reinforge.config.sft import SFTConfig
from reinforge.config.validate import validate
from reinforge.trainers.plan import plan_rl, plan_supervised
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
        plan_rl(cfg)


def test_vllm_without_the_package_fails_at_config_time(tiny_model_dir, arith_data, tmp_path):
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path),
                                                     **{"rollout.backend": "vllm", "trainer.device": "cpu"}))
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here: tests/vllm_real checks the CPU build's config")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="needs the vllm package"):
        plan_rl(cfg)


def test_derived(tiny_model_dir, arith_data, tmp_path):
    plan = plan_rl(load_config(RLConfig, "ppo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **{"rollout.n": 2})))
    assert plan.critic_enabled and plan.reference_enabled and plan.batch_size == 8


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
    (SFTConfig, "sft", "data.max_length=1", r"data.max_length=1 is out of range; valid range: \[2, inf\)"),
    (SFTConfig, "sft", "data.train_files=[]", "data.train_files is empty: give at least one parquet/JSONL file"),
    (DPOConfig, "prefs", "optim.lr_schedule=cosinus", "optim.lr_schedule='cosinus': constant, cosine or linear"),
    (DPOConfig, "prefs", "data.overlong=truncate_right", "data.overlong='truncate_right': error or skip"),
    (DPOConfig, "prefs", "dpo.loss_type=nope", r"dpo.loss_type='nope' is not known; valid: \['sigmoid', 'ipo', 'hinge', 'robust'\]"),
    (RMConfig, "prefs", "optim.micro_batch_size=0", r"optim.micro_batch_size=0 is out of range; valid range: \[1, inf\)"),
    (RMConfig, "prefs", "data.train_files=[]", "give at least one prompt/chosen/rejected file"),
])
def test_supervised_validation_messages(tiny_model_dir, arith_data, schema, data, extra, match):
    cfg = load_config(schema, None, [f"model.path={tiny_model_dir}", f"data.train_files=[{arith_data[data]}]",
                                     "trainer.device=cpu", extra])
    with pytest.raises(ConfigError, match=match):
        plan_supervised(cfg)


@pytest.mark.parametrize("schema,data", [(SFTConfig, "sft"), (DPOConfig, "prefs"), (RMConfig, "prefs")])
def test_supervised_derived(tiny_model_dir, arith_data, schema, data):
    cfg = load_config(schema, None, [f"model.path={tiny_model_dir}", f"data.train_files=[{arith_data[data]}]",
                                     "trainer.device=cpu", "data.batch_size=8", "optim.micro_batch_size=16",
                                     "trainer.epochs=2"])
    plan = plan_supervised(cfg).with_data(100)
    assert plan.record() == {"device": "cpu", "micro_batch_size": 8, "gradient_checkpointing": False, "total_steps": 25}


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


def _config_classes(root) -> set:
    """Every dataclass reachable from the config class `root` (its sections, recursively)."""
    from dataclasses import is_dataclass

    out = {root}
    for f in fields(root):
        default = f.default_factory() if callable(f.default_factory) else None
        if is_dataclass(default):
            out |= _config_classes(type(default))
    return out


def test_every_numeric_key_has_a_range():
    """A new int/float knob must be added to reinforge.config.ranges.RANGES."""
    from typing import get_type_hints

    from reinforge.config.ranges import range_of

    missing = []
    for root in (RLConfig, SFTConfig, DPOConfig, RMConfig):
        for cls in _config_classes(root):
            for name, hint in get_type_hints(cls).items():
                if hint in (int, float) or str(hint) in ("typing.Optional[float]", "typing.Optional[int]"):
                    if range_of(cls, name) is None:
                        missing.append(f"{cls.__name__}.{name}")
    assert not missing, missing


def test_defaults_and_presets_are_in_range():
    from reinforge.config.ranges import check_ranges

    for schema in (RLConfig, SFTConfig, DPOConfig, RMConfig):
        check_ranges(schema())
    for name in list_presets():
        for schema in (RLConfig, SFTConfig, DPOConfig, RMConfig):
            try:
                cfg = load_config(schema, name)
            except ConfigError:
                continue
            check_ranges(cfg)


@pytest.mark.parametrize("value,interval,inside", [
    (0.0, "[0, 1)", True), (1.0, "[0, 1)", False), (0.0, "(0, 1]", False), (1.0, "(0, 1]", True),
    (1e9, "(0, inf)", True), (float("inf"), "(0, inf)", False), (float("nan"), "(-inf, inf)", False),
    (-1, "[0, inf)", False), (2, "[2, inf)", True),
])
def test_in_interval(value, interval, inside):
    from reinforge.config.ranges import in_interval

    assert in_interval(value, interval) is inside


@pytest.mark.parametrize("schema,override,match", [
    (RLConfig, "actor.lr=-1", r"^actor.lr=-1.0 is out of range; valid range: \[0, inf\)$"),
    (RLConfig, "critic.betas=[0.9, 1.5]", r"^critic.betas\[1\]=1.5 is out of range; valid range: \[0, 1\)$"),
    (RLConfig, "actor.betas=[0.9, x]", r"^actor.betas\[1\]='x' must be a number in \[0, 1\)$"),
    (RLConfig, "rollout.top_p=0", r"^rollout.top_p=0.0 is out of range; valid range: \(0, 1\]$"),
    (RLConfig, "algorithm.gamma=1.01", r"^algorithm.gamma=1.01 is out of range"),
    (RLConfig, "data.max_prompt_length=0", r"^data.max_prompt_length=0 is out of range; valid range: \[1, inf\)$"),
    (RLConfig, "trainer.total_steps=-1", r"^trainer.total_steps=-1 is out of range; valid range: \[1, inf\)$"),
    (SFTConfig, "optim.lr=-1", r"^optim.lr=-1.0 is out of range; valid range: \[0, inf\)$"),
    (RLConfig, "actor.clip_c=1", r"^actor.clip_c=1.0 is out of range; valid range: \(1, inf\)$"),
    (RLConfig, "reward.default_score=.nan", r"^reward.default_score=nan is out of range"),
    (SFTConfig, "eval.pass_k=[1, 0]", r"^eval.pass_k\[1\]=0 is out of range"),
    (DPOConfig, "dpo.label_smoothing=0.5", r"^dpo.label_smoothing=0.5 is out of range; valid range: \[0, 0.5\)$"),
    (RMConfig, "data.val_fraction=1", r"^data.val_fraction=1.0 is out of range; valid range: \[0, 1\)$"),
])
def test_range_messages(schema, override, match):
    from reinforge.config.ranges import check_ranges

    with pytest.raises(ConfigError, match=match):
        check_ranges(load_config(schema, None, [override]))


@pytest.mark.parametrize("functions,expected", [
    ("[exact_match, 'f.py:fn']", [{"name": "exact_match", "weight": 1.0}, {"name": "f.py:fn", "weight": 1.0}]),
    ("[{name: ' format ', weight: 2}]", [{"name": "format", "weight": 2.0}]),
])
def test_reward_functions_short_form(functions, expected):
    from reinforge.config.validate import normalize_reward_functions

    cfg = load_config(RLConfig, None, [f"reward.functions={functions}"])
    assert normalize_reward_functions(cfg.reward.functions, "reward.functions") == expected


@pytest.mark.parametrize("functions,match", [
    ("[{name: exact_match, wieght: 2}]", r"reward.functions\[0\].wieght: unknown key; did you mean 'reward.functions\[0\].weight'"),
    ("[{weight: 2}]", r"reward.functions\[0\].name=None"),
    ("[{name: exact_match, weight: abc}]", r"reward.functions\[0\].weight='abc' must be a finite number"),
    ("[3]", r"reward.functions\[0\]=3: give a name"),
])
def test_reward_functions_malformed(functions, match):
    from reinforge.config.validate import normalize_reward_functions

    cfg = load_config(RLConfig, None, [f"reward.functions={functions}"])
    with pytest.raises(ConfigError, match=match):
        normalize_reward_functions(cfg.reward.functions, "reward.functions")


def test_reward_style_names_come_from_the_styles_registry():
    """A forced style is checked against rewards.styles' registry (config keeps no copy of it)."""
    from reinforge.rewards.styles import style_choices
    from reinforge.trainers.preflight import check_reward_names

    cfg = load_config(RLConfig, None, ["reward.functions=[{name: exact_match, style: openrlhf}]"])
    with pytest.raises(ConfigError, match=r"reward.functions\[0\].style='openrlhf'"):
        check_reward_names(cfg.reward, cfg.algorithm, cfg.rollout.max_response_length)
    assert style_choices()[0] == "auto" and {"reinforge", "verl", "trl"} <= set(style_choices())
    from reinforge.trainers.preflight import check_reward_styles

    with pytest.raises(ConfigError, match=r"eval.reward_functions\[1\].style='bogus'"):  # SFT / DPO eval
        check_reward_styles([{"name": "a"}, {"name": "b", "style": "bogus"}], "eval.reward_functions")


def test_yaml_syntax_error_names_file_line_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  n: 4\n  temperature: [1.0\nactor:\n  lr: 1e-3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line 4, column 6: YAML syntax error: expected ',' or ']'"):
        load_config(RLConfig, str(bad))
    with pytest.raises(ConfigError, match=r"override 'rollout.n=\[1': line 1, column 3: YAML syntax error"):
        load_config(RLConfig, None, ["rollout.n=[1"])


def test_bad_base_names_the_file_that_asks_for_it(tmp_path):
    (tmp_path / "child.yaml").write_text("base: grpoo\nrollout:\n  n: 4\n")
    with pytest.raises(ConfigError, match=r"child.yaml: base: config 'grpoo' is neither .* did you mean 'grpo'"):
        load_config(RLConfig, str(tmp_path / "child.yaml"))


@pytest.mark.parametrize("override,match", [
    ("rollout.n", "must look like section.key=value"),
    ("rollout..n=3", "is not a dotted key"),
    ("=3", "is not a dotted key"),
])
def test_malformed_overrides(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(RLConfig, None, [override])


def test_preset_typo_suggests_the_preset():
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        load_config(RLConfig, "grpoo")
