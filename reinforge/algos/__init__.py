"""Pure math of RL post-training: tensors in, tensors out. Imports only torch.

Registries (``algos.registry.Registry``: name -> function, each entry owning the dataclass of
the hyper-parameters it reads; ``.entry(name)`` raises ValueError on unknown names with the valid
ones and a did-you-mean): ``ADVANTAGE_ESTIMATORS``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``, ``AGG_MODES``.
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    NEEDS_BASELINE,
    NEEDS_GROUPS,
    NEEDS_VALUES,
    AdvantageInput,
    compute_advantages,
    get_advantage_estimator,
)
from .aggregation import AGG_MODES, agg_denominators, agg_loss
from .fused_logprobs import fused_logprobs_from_hidden
from .kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_full,
    kl_penalty,
    make_kl_controller,
)
from .logprobs import (
    entropy_from_logits,
    entropy_from_logits_chunked,
    logprobs_and_entropy_from_logits,
    logprobs_from_logits,
)
from .masked import masked_mean, masked_sum, masked_var, masked_whiten
from .overlong import soft_overlong_penalty
from .policy_loss import POLICY_LOSSES, get_policy_loss
from .preference import bradley_terry_loss, dpo_loss, sequence_logps
from .value_loss import clipped_value_loss, explained_variance

__all__ = [
    "ADVANTAGE_ESTIMATORS", "NEEDS_BASELINE", "NEEDS_GROUPS", "NEEDS_VALUES", "AdvantageInput",
    "compute_advantages", "get_advantage_estimator", "AGG_MODES", "agg_denominators", "agg_loss",
    "fused_logprobs_from_hidden", "KL_ESTIMATORS", "AdaptiveKLController", "FixedKLController",
    "kl_full", "kl_penalty", "make_kl_controller", "entropy_from_logits",
    "entropy_from_logits_chunked", "logprobs_and_entropy_from_logits", "logprobs_from_logits",
    "masked_mean", "masked_sum", "masked_var", "masked_whiten", "soft_overlong_penalty",
    "POLICY_LOSSES", "get_policy_loss", "bradley_terry_loss", "dpo_loss", "sequence_logps",
    "clipped_value_loss", "explained_variance",
]
