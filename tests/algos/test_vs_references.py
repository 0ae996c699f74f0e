"""Where reinforge's policy losses and advantages were read against veRL 0.9.1's `core_algos` and
a choice was made (docs/algorithms.md, "Differences from veRL and TRL"): each chosen behaviour
pinned on a hand-computed case. No test runs veRL (it is not a dependency).

- the log-ratio clamp, per loss: +-20 where veRL clamps (ppo_clip, vanilla, cispo, sapo, dppo_*),
  raw where veRL is raw (dro: never clamped; kl_cov, clip_cov, gmpo: clamped only where exp()
  would overflow), and `log_ratio_max`, which reports the extreme token;
- `ppo_kl` is the true k1 mean at any ratio (veRL: the mean of the clamped log-ratio);
- optimal_token_baseline's `handle_zero_tail` (veRL's default True) and its zero returns in holes;
- outcome estimators refuse a reward outside the response mask (veRL sums it, reinforge would
  drop it), and the reward sources of the pipeline never put one there.
"""

import math

import pytest
import torch

from reinforge.algos import AdvantageInput, compute_advantages, get_policy_loss
from reinforge.algos.advantages import check_rewards_in_mask, estimator_kwargs
from reinforge.algos.policy_loss import _exp_bound, log_ratio_max

ONE = torch.ones(1, 1)


def _one_token(name, lr, adv, **kw):
    """One valid token with log-ratio `lr` (log pi = -1) and advantage `adv` -> (loss, d loss / d log pi, metrics)."""
    lp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0 - lr]], dtype=torch.float64)
    loss, met = get_policy_loss(name)(lp, old, torch.tensor([[adv]], dtype=torch.float64), ONE.double(), **kw)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return loss.item(), g.item(), met


# --------------------------------------------------------------------------- the log-ratio clamp


def test_dro_is_never_clamped():
    # log r = 30, A = 1, beta = 0.05: loss = -A log pi + (beta / 2) 30^2 = 1 + 22.5; gradient -A + beta * 30 = 0.5.
    # (A clamp at 20 would give 1 + 10 and the gradient -1: the penalty's pull lost.)
    loss, g, _ = _one_token("dro", 30.0, 1.0, dro_beta=0.05)
    assert loss == pytest.approx(23.5, rel=1e-12) and g == pytest.approx(0.5, rel=1e-12)
    loss, g, _ = _one_token("dro", -40.0, 0.0, dro_beta=0.05)  # A = 0: the penalty alone, 0.025 * 1600 = 40
    assert loss == pytest.approx(40.0, rel=1e-12) and g == pytest.approx(-2.0, rel=1e-12)


def test_kl_cov_penalty_keeps_its_gradient_beyond_20():
    # One valid token, so it is the one penalised. A = 0: loss = coef |log r| = 0.1 * 30, gradient coef * sign = 0.1.
    loss, g, met = _one_token("kl_cov", 30.0, 0.0)
    assert loss == pytest.approx(3.0, rel=1e-12) and g == pytest.approx(0.1, rel=1e-12)
    assert met["pg_clipfrac"] == 1
    # A = -1, log r = 25: loss = e^25 + 2.5, gradient e^25 + 0.1 (veRL's raw ratio; a clamp would give e^20 + 2.5, 0.1).
    loss, g, _ = _one_token("kl_cov", 25.0, -1.0)
    assert loss == pytest.approx(math.exp(25) + 2.5, rel=1e-12) and g == pytest.approx(math.exp(25) + 0.1, rel=1e-12)


@pytest.mark.parametrize("name", ["clip_cov", "gmpo"])
def test_unclipped_negative_advantage_token_keeps_its_gradient_beyond_20(name):
    # A = -1, log r = 25: above 1 + clip_high the PPO max (and GMPO's sign-wise min) leaves a negative-advantage
    # token unclipped, loss -A r = e^25 and gradient e^25. (clip_cov: covariance 0, outside (1, 5): not dropped.)
    loss, g, met = _one_token(name, 25.0, -1.0)
    assert loss == pytest.approx(math.exp(25), rel=1e-12) and g == pytest.approx(math.exp(25), rel=1e-12)
    assert met["pg_clipfrac"] == 0


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "gmpo"])
def test_raw_ratio_is_clamped_only_where_exp_would_overflow(name):
    # fp32, log r = 100 on a negative-advantage token: e^100 is inf in fp32, so the ratio stops at e^88.
    lp = torch.tensor([[-1.0]], requires_grad=True)
    loss, _ = get_policy_loss(name)(lp, torch.tensor([[-101.0]]), -ONE, ONE)
    penalty = 0.1 * 100 if name == "kl_cov" else 0.0
    assert torch.isfinite(loss).all() and loss.item() == pytest.approx(math.exp(88) + penalty, rel=1e-6)
    assert (_exp_bound(torch.float32), _exp_bound(torch.bfloat16), _exp_bound(torch.float16),
            _exp_bound(torch.float64)) == (88.0, 88.0, 11.0, 709.0)


@pytest.mark.parametrize("name", ["ppo_clip", "vanilla", "sapo"])
def test_ratio_losses_clamp_at_20_as_verl(name):
    # A = -1, log r = 30: the ratio is e^20 (veRL's bound) and the token gets no gradient through it.
    loss, g, _ = _one_token(name, 30.0, -1.0)
    want = math.exp(20) if name != "sapo" else 4 / 1.05 * torch.sigmoid(torch.tensor(1.05 * (math.exp(20) - 1))).item()
    assert loss == pytest.approx(want, rel=1e-12) and g == 0.0


def test_log_ratio_max_over_valid_tokens():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    old = torch.tensor([[-31.0, -1.0, 200.0], [-1.5, float("nan"), -1.0]])  # |log r| 30, 1, 203; 0.5, nan, 0
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    assert log_ratio_max(lp, old, mask).item() == 30.0  # the masked 203 and NaN are not read
    assert log_ratio_max(lp, old, torch.zeros(2, 3)).item() == 0.0
    assert math.isnan(log_ratio_max(lp, old, torch.ones(2, 3)).item())  # a NaN on a valid token shows


def test_actor_reports_log_ratio_max(tiny_model_dir):
    from reinforge.config.schema import ActorConfig, ModelConfig
    from reinforge.models.loading import load_causal_lm
    from reinforge.protocol import Batch
    from reinforge.workers.actor import ActorWorker
    from tests.conftest import ragged_batch

    torch.manual_seed(0)
    model = load_causal_lm(tiny_model_dir, dtype="float32")
    actor = ActorWorker(model, ActorConfig(lr=1e-4, micro_batch_size=8), ModelConfig(path=tiny_model_dir),
                        total_steps=1, mini_batch_size=8, micro_batch_size=8, loss_norm_const=6, seed=0)
    batch = ragged_batch(model.config.vocab_size, 8, 4, 6, advantages=lambda g: torch.randn(8, 6, generator=g))
    old = actor.log_probs(batch, with_entropy=False)["old_log_probs"].clone()
    mask = batch["response_mask"]
    old[0, 0] -= 30.0  # a valid token (every row's first) whose ratio is e^30
    old[mask == 0] = 500.0  # padding: not read
    m = actor.update(batch | Batch({"old_log_probs": old}))
    # One mini-batch of one micro-batch: the value is that micro-batch's max whatever the reduction over several.
    assert m["actor/log_ratio_max"] == pytest.approx(30.0, abs=1e-3)


# --------------------------------------------------------------------------- ppo_kl at extreme ratios


@pytest.mark.parametrize("name", ["ppo_clip", "vanilla", "cispo", "sapo", "dppo_tv", "dppo_kl", "dro", "kl_cov"])
def test_ppo_kl_is_the_true_k1_mean(name):
    # Two tokens with log r = 30 and -1: ppo_kl = mean(old - new) = (-30 + 1) / 2 = -14.5 (veRL: (-20 + 1) / 2 in
    # vanilla, cispo, sapo, dppo_*; mean |log r| = 15.5 in kl_cov).
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    old = torch.tensor([[-31.0, -1.0]], dtype=torch.float64)
    _, met = get_policy_loss(name)(lp, old, torch.tensor([[1.0, -1.0]], dtype=torch.float64), torch.ones(1, 2))
    assert met["ppo_kl"].item() == pytest.approx(-14.5, rel=1e-12)


# --------------------------------------------------------------------------- optimal token baseline


def _otb(mask, rewards, groups, **kw):
    # pi = 0.5 and sum pi^2 = 0.5 everywhere: w = 1 - 1 + 0.5 = 0.5, W_t = 0.5 (t + 1) on right-padded rows.
    pi = torch.full(mask.shape, 0.5, dtype=torch.float64)
    inp = AdvantageInput(rewards, mask, group_ids=groups, old_log_probs=pi.log(), sum_pi_squared=pi.clone())
    return compute_advantages("optimal_token_baseline", inp, **kw)


def test_handle_zero_tail_on_right_padded_rows_as_verl():
    # One group: row 0 four tokens (reward 1 at t=3), rows 1 and 2 two tokens (rewards 3 and 0 at t=1).
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.float64)
    rewards = torch.tensor([[0, 0, 0, 1.0], [0, 3.0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    groups = torch.tensor([4, 4, 4])
    # t = 0, 1: all three rows valid with equal W_t, so B_t = mean G_t = (1 + 3 + 0) / 3 = 4/3 (up to the 1e-8).
    # t = 2, 3: row 0 alone: B_t = its own G_t = 1 (A = 0) without the option; 0 with it (A = G = 1), which is
    # veRL's rule: the unique longest row, from the second-longest length (2) on.
    head = [[1 - 4 / 3, 1 - 4 / 3], [3 - 4 / 3, 3 - 4 / 3], [-4 / 3, -4 / 3]]
    adv_on, ret = _otb(mask, rewards, groups)  # the default: handle_zero_tail=True
    adv_off, _ = _otb(mask, rewards, groups, handle_zero_tail=False)
    zero = [[0.0, 0.0]] * 3
    want_on = torch.tensor([h + t for h, t in zip(head, [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])], dtype=torch.float64)
    want_off = torch.tensor([h + t for h, t in zip(head, zero)], dtype=torch.float64)
    torch.testing.assert_close(adv_on, want_on, rtol=0, atol=1e-7)
    torch.testing.assert_close(adv_off, want_off, rtol=0, atol=1e-7)
    # A tie for the longest: no position has a row alone, the option changes nothing.
    tie = mask.clone()
    tie[1] = 1.0
    torch.testing.assert_close(_otb(tie, rewards, groups)[0], _otb(tie, rewards, groups, handle_zero_tail=False)[0])


def test_otb_returns_are_zero_in_holes():
    # Row 0 has a hole at t=1 (a tool output): veRL keeps the reward-to-go 2 there; reinforge writes 0 there,
    # as every per-token output outside the mask (the valid tokens' returns are the same).
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]], dtype=torch.float64)
    rewards = torch.tensor([[0, 0, 2.0], [0, 0, 1.0]], dtype=torch.float64)
    _, ret = _otb(mask, rewards, torch.tensor([0, 0]))
    torch.testing.assert_close(ret, torch.tensor([[2.0, 0.0, 2.0], [1.0, 1.0, 1.0]], dtype=torch.float64))


def test_handle_zero_tail_is_a_config_key():
    from reinforge.config.schema import AlgorithmConfig

    assert estimator_kwargs("optimal_token_baseline") == {"handle_zero_tail": True}
    assert estimator_kwargs("optimal_token_baseline", AlgorithmConfig(handle_zero_tail=False)) == {
        "handle_zero_tail": False}
    assert estimator_kwargs("grpo", AlgorithmConfig(handle_zero_tail=False)) == {}


# --------------------------------------------------------------------------- rewards outside the mask

OUTCOME = ["grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline", "remax", "opo", "grpo_passk", "gpg"]


@pytest.mark.parametrize("name", OUTCOME)
def test_outcome_estimators_refuse_a_reward_outside_the_mask(name):
    # Row 1's score sits on padding (t=2, past its last valid token t=1): veRL would count it, reinforge
    # would drop it; refused, naming the row and position.
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    rewards = torch.tensor([[0, 0, 1.0], [0, 0, 0.5]], dtype=torch.float64)
    inp = AdvantageInput(rewards, mask, group_ids=torch.tensor([0, 0]), baseline_rewards=torch.zeros(2))
    with pytest.raises(ValueError, match=r"token_level_rewards\[1, 2\] = 0.5 lies outside response_mask"):
        compute_advantages(name, inp)
    # Zero (or non-finite padding garbage) there is fine: grpo's advantages of scores 1 and 0.5.
    rewards[1, 2] = float("nan")
    rewards[1, 1] = 0.5
    adv, _ = compute_advantages(name, inp)
    assert torch.isfinite(adv).all()


def test_the_pipelines_reward_sources_never_put_one_outside_the_mask():
    from reinforge.algos.kl import FixedKLController
    from reinforge.protocol import Batch
    from reinforge.rewards.episodes import turn_level_scores
    from reinforge.trainers.stages import apply_kl_in_reward
    from reinforge.workers.reward import scores_to_tokens

    # Holes (tool tokens) and an empty row; scores land on each row's last valid token.
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 1]])
    placed = scores_to_tokens(torch.tensor([1.0, -2.0, 3.0, 0.5]), mask)
    torch.testing.assert_close(placed, torch.tensor([[0, 0, 1.0, 0], [0, -2.0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0.5]]))
    check_rewards_in_mask(placed, mask)
    # Multi-turn: a turn reward on its turn's last generated token, the rest on the episode's last.
    traj = [{"turn_ends": [0, 2], "turn_rewards": [0.25, 0.5]}, {"turn_ends": [1], "turn_rewards": [1.0]},
            {"turn_ends": [], "turn_rewards": []}, {"turn_ends": [0, 3], "turn_rewards": [0.0, 0.0]}]
    turns = turn_level_scores(torch.tensor([1.0, 1.0, 0.0, 0.5]), mask, traj, None)
    torch.testing.assert_close(turns, torch.tensor([[0.25, 0, 0.75, 0], [0, 1.0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0.5]]))
    check_rewards_in_mask(turns, mask)
    # The KL-in-reward penalty is masked, so a penalised batch is still zero there.
    g = torch.Generator().manual_seed(0)
    batch = Batch({"response_mask": mask, "token_level_scores": placed,
                   "old_log_probs": -torch.rand(4, 4, generator=g), "ref_log_probs": -torch.rand(4, 4, generator=g)})
    out, _ = apply_kl_in_reward(batch, FixedKLController(0.1), "k1")
    assert (out["token_level_rewards"][mask == 0] == 0).all()
    check_rewards_in_mask(out["token_level_rewards"], mask)


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus", "optimal_token_baseline"])
def test_token_level_estimators_skip_masked_rewards_as_verl(name):
    # veRL's GAE loop, REINFORCE++ recursion and OTB also skip a masked position's reward (the mask
    # carries the recursion past it): same results with and without a reward there.
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1]], dtype=torch.float64)
    rewards = torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, 2.0]], dtype=torch.float64)
    extra = dict(values=torch.full((2, 4), 0.25, dtype=torch.float64), group_ids=torch.tensor([0, 0]),
                 old_log_probs=torch.full((2, 4), math.log(0.5), dtype=torch.float64),
                 sum_pi_squared=torch.full((2, 4), 0.5, dtype=torch.float64))
    clean = compute_advantages(name, AdvantageInput(rewards, mask, **extra))
    dirty = rewards.clone()
    dirty[0, 1], dirty[0, 3] = 5.0, -7.0
    for a, b in zip(clean, compute_advantages(name, AdvantageInput(dirty, mask, **extra))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
