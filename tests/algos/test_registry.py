"""Registries whose entries own their parameters (reinforge/algos/registry.py).

The worked example of docs/extending.md ("Adding a policy loss"): a loss with one
hyper-parameter, registered here, gets its config key, its range check and a did-you-mean, and
trains for one actor update. Then the registries' own contracts: signatures equal params, every
param read, config fields equal params, docs tables generated from the registries."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import pytest
import torch

from reinforge.algos.masked import masked_mean
from reinforge.algos.policy_loss import POLICY_LOSSES
from reinforge.algos.registry import Registry, param
from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import ActorConfig, RLConfig
from reinforge.config.validate import validate
from tests.conftest import ragged_batch, rl_overrides
from tests.grad_check import record_steps

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- the worked example: one new loss


@dataclass
class ScaledPGParams:
    pg_scale: float = param(1.0, "(0, inf)", "scaled_pg: factor on the REINFORCE surrogate.")


def scaled_pg(log_probs, old_log_probs, advantages, response_mask, *, pg_scale=1.0):
    """Scaled REINFORCE: -pg_scale * A * log pi (the worked example of docs/extending.md)."""
    loss = -pg_scale * advantages * log_probs * response_mask  # (B, T), 0 outside the mask
    zero = torch.zeros((), dtype=log_probs.dtype)
    return loss, {"pg_clipfrac": zero, "pg_clipfrac_lower": zero,
                  "ppo_kl": masked_mean((old_log_probs - log_probs).detach(), response_mask)}


# A loss outside the package brings its key by mixing its params into the actor section (a
# built-in loss adds the field to ActorConfig instead; config/registries.check_section says so).
@dataclass
class ScaledActorConfig(ActorConfig, ScaledPGParams):
    pass


@dataclass
class ScaledRLConfig(RLConfig):
    actor: ScaledActorConfig = field(default_factory=ScaledActorConfig)


@pytest.fixture
def scaled_loss():
    POLICY_LOSSES.register("scaled_pg", scaled_pg, ScaledPGParams)
    yield
    POLICY_LOSSES.unregister("scaled_pg")


def _cfg(tiny_model_dir, arith_data, tmp_path, schema=ScaledRLConfig, **extra):
    over = rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **{"actor.policy_loss": "scaled_pg", **extra})
    return load_config(schema, "grpo", over)


def test_new_loss_key_range_and_did_you_mean(scaled_loss, tiny_model_dir, arith_data, tmp_path):
    cfg = validate(_cfg(tiny_model_dir, arith_data, tmp_path, **{"actor.pg_scale": 2.0}))
    assert cfg.actor.pg_scale == 2.0
    assert POLICY_LOSSES.entry("scaled_pg").kwargs(cfg.actor, generator=None) == {"pg_scale": 2.0}
    with pytest.raises(ConfigError, match=r"^actor.pg_scale=-1.0 is out of range; valid range: \(0, inf\)$"):
        validate(_cfg(tiny_model_dir, arith_data, tmp_path, **{"actor.pg_scale": -1}))
    with pytest.raises(ConfigError, match="did you mean 'actor.pg_scale'"):
        _cfg(tiny_model_dir, arith_data, tmp_path, **{"actor.pg_scal": 2.0})
    with pytest.raises(ConfigError, match=r"actor.policy_loss='scaled_p' is not known; valid: .*did you mean"):
        validate(_cfg(tiny_model_dir, arith_data, tmp_path, **{"actor.policy_loss": "scaled_p"}))
    # the plain actor section has no field for the new key: the check names the field to add
    with pytest.raises(ConfigError, match="reads 'pg_scale', which ActorConfig lacks: add a field `pg_scale"):
        validate(_cfg(tiny_model_dir, arith_data, tmp_path, schema=RLConfig))


def test_new_loss_trains_one_actor_step(scaled_loss, tiny_model_dir, arith_data, tmp_path):
    """One update of the actor with scaled_pg (pg_scale 2): the gradient is twice reinforce's."""
    from reinforge.config.schema import ModelConfig
    from reinforge.models.loading import load_causal_lm
    from reinforge.workers.actor import ActorWorker

    def actor(cfg):
        model = load_causal_lm(tiny_model_dir, dtype="float32")
        return ActorWorker(model, cfg, ModelConfig(path=tiny_model_dir), total_steps=1, mini_batch_size=8,
                           micro_batch_size=4, loss_norm_const=6, seed=0)

    over = {"actor.pg_scale": 2.0, "actor.grad_clip": 0, "actor.lr": 1e-4,  # no clipping: gradients keep their scale
            "actor.use_kl_loss": False}
    cfg = validate(_cfg(tiny_model_dir, arith_data, tmp_path, **over))
    scaled = actor(cfg.actor)
    plain = actor(replace(cfg.actor, policy_loss="reinforce"))
    assert scaled.loss_kw == {"pg_scale": 2.0} and plain.loss_kw == {}
    batch = ragged_batch(scaled.model.config.vocab_size, 8, 4, 6, advantages=lambda g: torch.randn(8, 6, generator=g))
    batch = batch | scaled.log_probs(batch)
    before = [p.detach().clone() for p in scaled.params]
    ga, gb = record_steps(scaled.opt, scaled.params), record_steps(plain.opt, plain.params)
    metrics = scaled.update(batch)
    plain.update(batch)
    assert len(ga) == len(gb) == 1 and math.isfinite(metrics["actor/pg_loss"])
    for a, b in zip(ga[0], gb[0]):
        assert torch.allclose(a, 2 * b, rtol=1e-4, atol=1e-7)
    assert any(not torch.equal(p, q) for p, q in zip(before, scaled.params))


# ---------------------------------------------------------------- the registries' contracts


def test_registration_rejects_ignored_undeclared_or_undocumented_params():
    reg = Registry("policy loss", check_signature=True)
    reg.register("ok", scaled_pg, ScaledPGParams)

    def takes_clip(log_probs, old_log_probs, advantages, response_mask, *, pg_scale=1.0, clip_low=0.2):
        return log_probs, {}

    with pytest.raises(TypeError, match="must be its params' fields"):
        reg.register("ignored", takes_clip, ScaledPGParams)  # clip_low accepted but not declared
    with pytest.raises(TypeError, match="must be its params' fields"):
        reg.register("undeclared", scaled_pg)  # pg_scale read but declared nowhere

    def other_default(log_probs, old_log_probs, advantages, response_mask, *, pg_scale=3.0):
        return log_probs, {}

    with pytest.raises(TypeError, match="defaults differ"):
        reg.register("drift", other_default, ScaledPGParams)

    @dataclass
    class Bare:
        pg_scale: float = 1.0

    with pytest.raises(TypeError, match=r"needs param\(default, range, doc\)"):
        reg.register("bare", scaled_pg, Bare)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("ok", scaled_pg, ScaledPGParams)

    @dataclass
    class Clash:
        pg_scale: float = param(3.0, "(0, inf)", "another default under the same key")

    reg.register("clash", other_default, Clash)
    with pytest.raises(TypeError, match="declared twice"):
        reg.param_fields()


@pytest.mark.parametrize("kind,bad,close", [
    ("policy_loss.POLICY_LOSSES", "ppo_clp", "ppo_clip"), ("advantages.ADVANTAGE_ESTIMATORS", "rlo", "rloo"),
    ("kl.KL_ESTIMATORS", "low_var", "low_var_kl"), ("aggregation.AGG_MODES", "token_mean", "token-mean")])
def test_unknown_names_list_the_valid_ones_with_a_did_you_mean(kind, bad, close):
    import importlib

    module, name = kind.split(".")
    reg = getattr(importlib.import_module(f"reinforge.algos.{module}"), name)
    with pytest.raises(ValueError, match=rf"did you mean '{close}'\? valid: \[") as exc:
        reg.entry(bad)
    assert str(sorted(reg)) in str(exc.value)


# Another in-range value for each policy-loss param: every loss must respond to each one it declares.
OTHER = dict(clip_low=0.01, clip_high=0.01, clip_c=1.5, tau_pos=4.0, tau_neg=4.0, clip_cov_ratio=1.0,
             clip_cov_lb=-1e9, clip_cov_ub=1e-9, kl_cov_ratio=1.0, ppo_kl_coef=5.0, dro_beta=3.0)


@pytest.mark.parametrize("entry", POLICY_LOSSES.entries(), ids=lambda e: e.name)
def test_each_loss_reads_every_param_it_declares(entry):
    g = torch.Generator().manual_seed(0)
    lp = (torch.randn(4, 8, generator=g) - 1.5).clamp(max=-0.05)
    old = (lp + torch.tensor([[-1.0], [1.0], [-0.3], [0.3]]) + 0.6 * torch.randn(4, 8, generator=g)).clamp(max=-0.05)
    adv, mask = 2 * torch.randn(4, 8, generator=g), torch.ones(4, 8)

    def run(**kw):
        call = {**entry.kwargs(generator=torch.Generator().manual_seed(1)), **kw}
        loss, met = entry.fn(lp, old, adv, mask, **call)
        return torch.cat([loss.flatten(), torch.stack(list(met.values()))])

    base = run()
    for f in entry.param_fields():
        assert not torch.equal(run(**{f.name: OTHER[f.name]}), base), f"{entry.name} ignores {f.name}"


def test_config_fields_are_the_registries_params():
    """Each registry param is a field of its config section with the same default and type."""
    from reinforge.config.registries import PARAM_SECTIONS, check_section, registry
    from reinforge.config.schema import AlgorithmConfig

    for cls in (ActorConfig, AlgorithmConfig):
        reg = registry(*PARAM_SECTIONS[cls.__name__])
        have = {f.name: f for f in fields(cls)}
        for entry in reg.entries():
            check_section(cls, entry, "test")
        for name, p in reg.param_fields().items():
            assert str(have[name].type) == str(p.type), (cls.__name__, name)


def test_needs_sets_are_the_estimators_traits():
    from reinforge.algos import advantages as A

    assert A.NEEDS_VALUES == {"gae"} and A.NEEDS_BASELINE == {"remax"}
    assert A.NEEDS_TOKEN_STATS == {"optimal_token_baseline"}
    assert A.NEEDS_GROUPS == A.ADVANTAGE_ESTIMATORS.with_trait("needs_groups") and "grpo" in A.NEEDS_GROUPS


def test_docs_tables_are_generated_from_the_registries():
    """docs/algorithms.md holds each table as `python -m reinforge.config.registries` writes it."""
    from reinforge.config.registries import docs_tables, render_docs

    doc = (Path(__file__).parents[2] / "docs" / "algorithms.md").read_text(encoding="utf-8")
    assert render_docs(doc) == doc, "run: python -m reinforge.config.registries docs/algorithms.md"
    for table in docs_tables().values():
        assert table in doc
