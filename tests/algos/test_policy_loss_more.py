"""veRL 0.9's extra policy losses (reinforce/gpg, sapo, clip_cov, kl_cov, dppo_tv/kl, dro), the
token-sum aggregation and the `+` KL names: hand-computed values, metrics and gradients, and a
one-step GRPO run with each loss."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from reinforge.algos import agg_loss, get_policy_loss, kl_penalty
from reinforge.algos.policy_loss import POLICY_LOSSES
from reinforge.cli.main import main
from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import RLConfig
from reinforge.config.validate import validate
from tests.conftest import rl_overrides


def _grad(loss, lp):
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return g


def test_reinforce_is_minus_a_logp_off_policy_too():
    lp = torch.tensor([[math.log(0.5), math.log(0.25), -3.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, -1.0]])  # ratio != 1: the gradient must still be -A
    adv = torch.tensor([[2.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, met = get_policy_loss("reinforce")(lp, old, adv, mask)
    # -2 ln 0.5 = 2 ln 2; -(-1) ln 0.25 = -2 ln 2; padded token 0
    assert torch.allclose(loss, torch.tensor([[2 * math.log(2), -2 * math.log(2), 0.0]]))
    assert torch.allclose(_grad(loss, lp), torch.tensor([[-2.0, 1.0, 0.0]]))
    assert met["pg_clipfrac"] == 0 and met["pg_clipfrac_lower"] == 0
    # ppo_kl = mean(old - lp) over the two valid tokens = (-1 + ln 2 - 1 + 2 ln 2) / 2
    assert math.isclose(met["ppo_kl"].item(), (-2 + 3 * math.log(2)) / 2, rel_tol=1e-6)
    assert POLICY_LOSSES["gpg"] is POLICY_LOSSES["reinforce"]  # veRL's gpg loss: the same -A log pi


def test_sapo_soft_gate_values_and_gradient():
    ratios = torch.tensor([[1.0, 1.5, 0.5]])
    lp = ratios.log().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, met = get_policy_loss("sapo")(lp, torch.zeros(1, 3), adv, torch.ones(1, 3), tau_pos=1.0, tau_neg=2.0)
    # f(r) = (4/tau) sigmoid(tau (r - 1)): f(1) = 2; tau=1, r=1.5: 4 sigmoid(0.5) = 2.489837;
    # tau=2 (A<0), r=0.5: 2 sigmoid(-1) = 0.537883; loss = -A f
    assert torch.allclose(loss, torch.tensor([[-2.0, -2.489837, 0.537883]]), atol=1e-6)
    # d loss / d logp = -A * f'(r) * r with f'(r) = 4 s (1 - s), s = sigmoid(tau (r - 1)):
    # tok0: -1 * 1 * 1; tok1: -(4 * 0.622459 * 0.377541) * 1.5 = -1.410021;
    # tok2: +(4 * 0.268941 * 0.731059) * 0.5 = 0.393224
    assert torch.allclose(_grad(loss, lp), torch.tensor([[-1.0, -1.410021, 0.393224]]), atol=1e-5)
    assert met["pg_clipfrac"] == 0 and met["pg_clipfrac_lower"] == 0


# Shared by the covariance losses. Valid tokens' log-probs mean -1.3, advantages mean 0, so the
# per-token covariance (A - 0) * (logp + 1.3) = [2*1.2, 1*0.3, -1*-0.7, -2*-0.8] = [2.4, 0.3, 0.7, 1.6].
# The fifth token is padding with extreme values: it must not enter the means nor be picked.
LP = [-0.1, -1.0, -2.0, -2.1, -50.0]
ADV = [2.0, 1.0, -1.0, -2.0, 100.0]
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])


def test_clip_cov_detaches_only_unclipped_tokens_inside_the_window():
    lp = torch.tensor([LP], requires_grad=True)
    old = lp.detach().clone()
    old[0, 0] -= math.log(1.5)  # tok0: ratio 1.5 with A > 0, so the PPO clip (0.2) binds there
    adv = torch.tensor([ADV])
    # window (1, 5) holds tok0 (2.4) and tok3 (1.6); tok0 is already clipped, so room for 2 drops only tok3
    loss, met = get_policy_loss("clip_cov")(lp, old, adv, MASK, clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=5.0)
    # tok0: -A * 1.2 (clipped); tok1: -1; tok2: +1; tok3: dropped -> 0
    assert torch.allclose(loss, torch.tensor([[-2.4, -1.0, 1.0, 0.0, 0.0]]))
    assert torch.allclose(_grad(loss, lp), torch.tensor([[0.0, -1.0, 1.0, 0.0, 0.0]]))
    assert met["pg_clipfrac"].item() == 0.25 and met["pg_clipfrac_lower"].item() == 0


def test_clip_cov_draws_one_candidate_at_random_reproducibly():
    lp, adv = torch.tensor([LP], requires_grad=True), torch.tensor([ADV])
    dropped = set()
    for seed in range(8):
        # 0.25 * 4 valid tokens = 1 drop among the two candidates tok0 (2.4) and tok3 (1.6)
        kw = dict(clip_cov_ratio=0.25, clip_cov_lb=1.0, clip_cov_ub=5.0)
        loss, _ = get_policy_loss("clip_cov")(lp, lp.detach(), adv, MASK, generator=torch.Generator().manual_seed(seed), **kw)
        again, _ = get_policy_loss("clip_cov")(lp, lp.detach(), adv, MASK, generator=torch.Generator().manual_seed(seed), **kw)
        assert torch.equal(loss, again)
        zero = [t for t in range(4) if loss[0, t] == 0]
        assert len(zero) == 1 and zero[0] in (0, 3)
        dropped.add(zero[0])
    assert dropped == {0, 3}  # both candidates get drawn over 8 seeds


def test_kl_cov_penalises_the_top_covariance_tokens():
    lr = torch.tensor([[0.1, 0.0, 0.0, -0.2, 0.0]])
    lp = torch.tensor([LP], requires_grad=True)
    adv = torch.tensor([ADV])
    loss, met = get_policy_loss("kl_cov")(lp, lp.detach() - lr, adv, MASK, kl_cov_ratio=0.5, ppo_kl_coef=0.1)
    # top 2 of 4 by covariance: tok0 (2.4), tok3 (1.6): -A r + 0.1 |log r|; the others -A r, unclipped
    # tok0: -2 e^0.1 + 0.01 = -2.200342; tok3: 2 e^-0.2 + 0.02 = 1.657462
    assert torch.allclose(loss, torch.tensor([[-2.200342, -1.0, 1.0, 1.657462, 0.0]]), atol=1e-6)
    # gradient: -A r + 0.1 sign(log r): tok0 -2.210342 + 0.1; tok3 1.637462 - 0.1
    assert torch.allclose(_grad(loss, lp), torch.tensor([[-2.110342, -1.0, 1.0, 1.537462, 0.0]]), atol=1e-5)
    assert met["pg_clipfrac"].item() == 0.5
    assert math.isclose(met["ppo_kl"].item(), 0.1 / 4, rel_tol=1e-5)  # mean(old - lp) = (-0.1 + 0.2) / 4


def test_kl_cov_picks_at_least_one_token():
    lp, adv = torch.tensor([LP], requires_grad=True), torch.tensor([ADV])
    lr = torch.full((1, 5), 0.5)
    loss, met = get_policy_loss("kl_cov")(lp, lp.detach() - lr, adv, MASK)  # default ratio 2e-4 of 4 tokens
    assert met["pg_clipfrac"].item() == 0.25
    assert math.isclose(loss[0, 0].item(), -2 * math.exp(0.5) + 0.1 * 0.5, rel_tol=1e-6)  # tok0 has the top cov


# DPPO: old and new probabilities of five sampled tokens and their advantages.
P_OLD = [0.5, 0.5, 0.5, 0.5, 0.01]
P_NEW = [0.8, 0.6, 0.2, 0.8, 0.1]
ADV5 = [1.0, 1.0, -1.0, -1.0, 1.0]


def _dppo(name, **kw):
    lp = torch.tensor([P_NEW]).log().requires_grad_(True)
    loss, met = get_policy_loss(name)(lp, torch.tensor([P_OLD]).log(), torch.tensor([ADV5]), torch.ones(1, 5), **kw)
    return loss, _grad(loss, lp), met


def test_dppo_tv_drops_tokens_whose_probability_moved_too_far():
    loss, grad, met = _dppo("dppo_tv", clip_low=0.2, clip_high=0.2, clip_c=5.0)
    # p - p_old = [0.3, 0.1, -0.3, 0.3, 0.09]: tok0 (A>0, +0.3 > 0.2) and tok2 (A<0, -0.3 < -0.2) dropped;
    # tok3 rose but its A < 0 only checks the lower side: kept. Kept: -A * min(r, 5) * log p:
    # tok1 r=1.2: -1.2 ln 0.6 = 0.612991; tok3 r=1.6: 1.6 ln 0.8 = -0.357030; tok4 r=10 -> 5: -5 ln 0.1 = 11.512925
    assert torch.allclose(loss, torch.tensor([[0.0, 0.612991, 0.0, -0.357030, 11.512925]]), atol=1e-5)
    assert torch.allclose(grad, torch.tensor([[0.0, -1.2, 0.0, 1.6, -5.0]]), atol=1e-5)
    assert math.isclose(met["pg_clipfrac"].item(), 2 / 5, rel_tol=1e-6) and math.isclose(met["pg_clipfrac_lower"].item(), 1 / 5, rel_tol=1e-6)


def test_dppo_kl_uses_the_binary_kl_of_the_sampled_token():
    loss, grad, met = _dppo("dppo_kl", clip_low=0.25, clip_high=0.2, clip_c=5.0)
    # binary KL: 0.5->0.8 and 0.5->0.2 both 0.5 ln(5/8) + 0.5 ln(5/2) = 0.223144; 0.5->0.6: 0.020411;
    # 0.01->0.1: 0.01 ln 0.1 + 0.99 ln(0.99/0.9) = 0.071331. tok0 rose with A>0 and 0.223 > 0.2: dropped;
    # tok2 fell with A<0 but 0.223 <= clip_low 0.25: kept (-(-1) 0.4 ln 0.2 = -0.643775); tok3 rose, A<0: kept
    assert torch.allclose(loss, torch.tensor([[0.0, 0.612991, -0.643775, -0.357030, 11.512925]]), atol=1e-5)
    assert torch.allclose(grad, torch.tensor([[0.0, -1.2, 0.4, 1.6, -5.0]]), atol=1e-5)
    assert math.isclose(met["pg_clipfrac"].item(), 1 / 5, rel_tol=1e-6)
    _, _, met = _dppo("dppo_kl", clip_low=0.2, clip_high=0.2, clip_c=5.0)
    assert math.isclose(met["pg_clipfrac"].item(), 2 / 5, rel_tol=1e-6)  # with clip_low 0.2, tok2 is dropped too


def test_dppo_ratio_cap_defaults_to_20():
    lp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, met = get_policy_loss("dppo_tv")(lp, torch.tensor([[math.log(0.01)]]), torch.ones(1, 1), torch.ones(1, 1),
                                           clip_high=0.5)
    assert math.isclose(loss.item(), -20 * math.log(0.5), rel_tol=1e-6)  # r = 50 capped at 20
    assert met["pg_clipfrac_lower"].item() == 1


def test_dro_quadratic_log_ratio_penalty():
    lr = torch.tensor([[0.2, -0.4, 0.4]])
    lp = torch.tensor([[0.5, 0.25, 0.5]]).log().requires_grad_(True)
    adv = torch.tensor([[1.0, -2.0, 0.0]])
    loss, met = get_policy_loss("dro")(lp, lp.detach() - lr, adv, torch.ones(1, 3), dro_beta=0.5)
    # -A log p + 0.25 (log r)^2: -ln 0.5 + 0.01 = 0.703147; 2 ln 0.25 + 0.04 = -2.732589; A = 0: 0.04
    assert torch.allclose(loss, torch.tensor([[0.703147, -2.732589, 0.04]]), atol=1e-6)
    # gradient -A + 0.5 log r: the penalty pulls back even where A = 0
    assert torch.allclose(_grad(loss, lp), torch.tensor([[-0.9, 1.8, 0.2]]), atol=1e-6)
    assert met["pg_clipfrac"] == 0


def test_token_sum_aggregation_divides_by_nothing():
    L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = agg_loss(L, m, "token-sum", num_tokens=100, num_seqs=100)  # global counts are not used
    assert out.item() == 1 + 2 + 4 + 5 + 6
    (g,) = torch.autograd.grad(out, L)
    assert torch.equal(g, m)


def test_loss_kwargs_picks_what_each_loss_declares():
    # issue 21: a loss declares only what it reads (sapo took and ignored clip_low/clip_high/clip_c before)
    pool = SimpleNamespace(clip_low=0.1, clip_high=0.3, clip_c=3.0, tau_pos=2.0, kl_cov_ratio=0.1)
    assert POLICY_LOSSES.entry("sapo").kwargs(pool, generator=None) == dict(tau_pos=2.0, tau_neg=1.05)
    assert "generator" in POLICY_LOSSES.entry("clip_cov").kwargs(pool, generator=None)
    assert "tau_pos" not in POLICY_LOSSES.entry("ppo_clip").kwargs(pool, generator=None)


@pytest.mark.parametrize("plus, base", [("low_var_kl+", "k3"), ("k3+", "k3"), ("kl+", "k1"), ("k2+", "k2"),
                                        ("mse+", "k2")])
def test_plus_kl_names_value_of_base_gradient_of_k2(plus, base):
    lp = torch.tensor([[-0.5, -2.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.5, -1.0]])
    got = kl_penalty(lp, ref, plus)
    assert torch.allclose(got, kl_penalty(lp.detach(), ref, base))
    # k2 = 0.5 (lp - ref)^2 has gradient lp - ref = [0.5, -0.5, 0]
    assert torch.allclose(_grad(got, lp), torch.tensor([[0.5, -0.5, 0.0]]))


@pytest.mark.parametrize("loss, agg", [("reinforce", "token-sum"), ("gpg", "token-mean"), ("sapo", "seq-mean-token-mean"),
                                       ("clip_cov", "token-mean"), ("kl_cov", "token-mean"), ("dppo_tv", "token-mean"),
                                       ("dppo_kl", "token-mean"), ("dro", "token-mean")])
def test_each_new_loss_trains_one_grpo_step(loss, agg, tiny_model_dir, arith_data, tmp_path):
    run = tmp_path / loss
    extra = {"actor.policy_loss": loss, "actor.loss_agg_mode": agg, "trainer.total_steps": 1,
             "actor.use_kl_loss": True, "actor.kl_loss_type": "low_var_kl+"}
    assert main(["train", "--config", "grpo", *rl_overrides(tiny_model_dir, arith_data, str(run), **extra)]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r["step"] == 1][0]
    assert math.isfinite(step["actor/pg_loss"]) and step["actor/grad_norm"] > 0


def test_clip_cov_window_must_be_nonempty(tiny_model_dir, arith_data, tmp_path):
    over = rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **{"actor.clip_cov_lb": 5, "actor.clip_cov_ub": 1})
    with pytest.raises(ConfigError, match=r"actor.clip_cov_lb=5.0 must be below actor.clip_cov_ub=1.0"):
        validate(load_config(RLConfig, "grpo", over))
