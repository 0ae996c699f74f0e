"""KL divergence between the policy and the reference policy, and KL coefficient controllers.

Per-token estimators of KL(pi || pi_ref) from the log-probs of the sampled tokens
(J. Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html),
with log r = log pi - log pi_ref:

- ``k1`` / ``kl``: log r (unbiased, high variance, can be negative).
- ``abs``: |log r|.
- ``k2`` / ``mse``: 0.5 * (log r)^2.
- ``k3`` / ``low_var_kl``: exp(-log r) + log r - 1 (unbiased, >= 0, low variance). The log
  ratio is clamped to [-20, 20] and the result to [-10, 10] for numerical safety.
- ``k1+`` / ``kl+``, ``k3+`` / ``low_var_kl+``: straight-through: the value of k1 / k3, the
  gradient of k2 (whose gradient, (log r) * grad log pi, is the on-policy gradient of
  KL(pi || pi_ref) when the penalty is summed over sampled tokens). veRL's rule: a ``+`` suffix
  means "this value, k2's gradient", so ``k2+`` / ``mse+`` are plain k2.
- ``full``: exact KL from full distributions, (..., V) log-prob rows -> (...).
"""

from __future__ import annotations

import torch

from .registry import Registry

LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def _k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return log_probs - ref_log_probs


def _abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return (log_probs - ref_log_probs).abs()


def _k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_probs - ref_log_probs).square()


def _k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    kl = (ref_log_probs - log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # log(pi_ref/pi)
    return (torch.exp(kl) - kl - 1).clamp(-K3_CLAMP, K3_CLAMP)


def _straight_through(value_fn):
    """Value of value_fn, gradient of k2."""

    def fn(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
        k2 = _k2(log_probs, ref_log_probs)
        return value_fn(log_probs, ref_log_probs).detach() + (k2 - k2.detach())

    return fn


def kl_full(log_probs_full: torch.Tensor, ref_log_probs_full: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi || pi_ref) per position: sum_v p_v (log p_v - log q_v).

    log_probs_full, ref_log_probs_full: (..., V) normalised log-probs -> (...).
    """
    return (log_probs_full.exp() * (log_probs_full - ref_log_probs_full)).sum(-1)


KL_ESTIMATORS = Registry("KL estimator")
KL_ESTIMATORS.register("k1", _k1, aliases=("kl",), doc="log r (unbiased, high variance, can be negative)")
KL_ESTIMATORS.register("abs", _abs, doc="|log r|")
KL_ESTIMATORS.register("k2", _k2, aliases=("mse", "k2+", "mse+"),
                       doc="0.5 (log r)^2 (a `+` keeps k2: its gradient is k2's)")
KL_ESTIMATORS.register("k3", _k3, aliases=("low_var_kl",),
                       doc="exp(-log r) + log r - 1 (unbiased, >= 0, low variance; log r clamped to +-20, "
                           "result to +-10)")
KL_ESTIMATORS.register("k1+", _straight_through(_k1), aliases=("kl+",), doc="the value of k1, the gradient of k2")
KL_ESTIMATORS.register("k3+", _straight_through(_k3), aliases=("low_var_kl+",),
                       doc="the value of k3, the gradient of k2")
KL_ESTIMATORS.register("full", kl_full,
                       doc="exact KL from full (..., V) log-prob rows (not for the trainer, which has (B, T))")


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate. log_probs, ref_log_probs: (B, T) -> (B, T).

    For ``estimator="full"`` pass full rows (B, T, V) and get (B, T).
    """
    return KL_ESTIMATORS.entry(estimator).fn(log_probs, ref_log_probs)


class FixedKLController:
    """Constant KL coefficient."""

    def __init__(self, coef: float):
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept so both controllers share one interface)."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, d: dict) -> None:
        self.value = float(d["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593).

    error = clip(current_kl / target_kl - 1, -0.2, 0.2); value *= 1 + error * n_steps / horizon.
    Takes python floats: the trainer reduces the KL to a number once per step.
    """

    def __init__(self, init_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError("AdaptiveKLController needs target_kl > 0 and horizon > 0")
        self.value = float(init_coef)
        self.target_kl = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, d: dict) -> None:
        self.value = float(d["value"])
        self.target_kl = float(d.get("target_kl", self.target_kl))
        self.horizon = float(d.get("horizon", self.horizon))


KL_CONTROLLERS = ("fixed", "adaptive")


def make_kl_controller(
    kind: str, coef: float, target_kl: float | None = None, horizon: int | None = None
) -> FixedKLController | AdaptiveKLController:
    """Build a KL controller by name: "fixed" (coef) or "adaptive" (coef, target_kl, horizon)."""
    if kind == "fixed":
        return FixedKLController(coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; valid: {list(KL_CONTROLLERS)}")
