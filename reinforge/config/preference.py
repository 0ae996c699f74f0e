"""Typed configuration of preference training: DPO (`reinforge dpo`) and reward models (`reinforge rm`).

Both read the same preference files (prompt/chosen/rejected, text or chat messages) and share
the data, optim and trainer sections; the method's own knobs live under `dpo:` or `rm:`. The
model section is the RL one, so an SFT export, a DPO run and the RL run after it read the same
keys. `validate_preference` checks the values before any model loads (trainers/plan.py derives the
run's plan from them).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Optional

from reinforge.config.common import GenEvalConfig, OptimConfig, RootConfig, SupervisedRunConfig
from reinforge.config.schema import ModelConfig
from reinforge.config.ranges import check_ranges
from reinforge.config.validate import check_model_path, need, normalize_reward_functions, validate_supervised

REDUCTIONS = ("auto", "sum", "mean")

# dpo.reduction per loss type: the default `auto` resolves to the first entry (the published
# form, and TRL's), a second entry is the other published form; any other combination is refused.
LOSS_REDUCTIONS = {
    "sigmoid": ("sum", "mean"),  # mean: length-normalised DPO (TRL's sigmoid_norm: (pi - ref) / |y|)
    "robust": ("sum",),  # rDPO on sequence log-probs (TRL's `robust`)
    "ipo": ("mean", "sum"),  # mean: TRL and the IPO authors; sum: Eq. 17 on sequence log-probs as written
    "hinge": ("sum",),  # SLiC's sequence log-likelihoods
    "simpo": ("mean",),  # SimPO's reward is the length-normalised log-likelihood
    "cpo": ("sum",),
    "orpo": ("mean",),  # ORPO's odds are of the token-mean likelihood
    "kto": ("sum",),  # KTO's log-ratio is of sequence log-probs
}
REDUCTION_HINTS = {  # what to use instead of a refused combination
    ("simpo", "sum"): "summed log-probs without a margin are dpo.loss_type=cpo",
    ("cpo", "mean"): "token means with cpo are SimPO without a margin: dpo.loss_type=simpo dpo.simpo_gamma=0",
}


def resolved_reduction(loss_type: str, reduction: str) -> str:
    """dpo.reduction with `auto` resolved for `loss_type` (LOSS_REDUCTIONS; unknown losses: sum)."""
    return LOSS_REDUCTIONS.get(loss_type, ("sum",))[0] if reduction == "auto" else reduction


@dataclass
class PrefDataConfig:
    train_files: list = field(default_factory=list)
    """Parquet/JSONL files of prompt/chosen/rejected rows (a task's prefs.parquet)."""
    val_files: list = field(default_factory=list)
    """Held-out pairs; empty means hold out data.val_fraction of the training pairs."""
    val_fraction: float = 0.05
    """Fraction of training pairs held out for evaluation when val_files is empty (0: none)."""
    max_val_pairs: int = 256
    """Evaluate on at most this many held-out pairs."""
    max_length: int = 128
    """Longest prompt + response + EOS in tokens."""
    overlong: str = "error"
    """What to do with a longer pair: error or skip."""
    batch_size: int = 16
    """Pairs per optimizer step (each pair is two sequences)."""
    seed: int = 1
    """Shuffling seed for the pair order and the held-out split."""
    max_pixels: int = 12845056
    """Largest image (width * height pixels) an image row may hold; a larger one is refused
    when the data loads, naming file, row and field. The default is the Qwen2-VL image
    processor's own budget (16384 patches of 28x28 pixels)."""


@dataclass
class DPOParams:
    beta: float = 0.1
    """Strength of the implicit KL to the reference (smaller: the policy may move further)."""
    loss_type: str = "sigmoid"
    """sigmoid (DPO; cDPO with label_smoothing), robust (rDPO), ipo, hinge (SLiC), the reference-free simpo, cpo, orpo (no reference model
    is loaded: ref_model_path and precompute_ref do not apply), or kto (unpaired rows
    prompt/completion/label; paired rows count as one desirable and one undesirable row)."""
    simpo_gamma: float = 1.0
    """simpo only: the target reward margin gamma in -log sigma(beta d - gamma)."""
    desirable_weight: float = 1.0
    """kto only: weight of the desirable completions' loss (lambda_D)."""
    undesirable_weight: float = 1.0
    """kto only: weight of the undesirable completions' loss (lambda_U); the KTO paper advises
    lambda_D n_D / (lambda_U n_U) in [1, 4/3] when the classes are imbalanced."""
    label_smoothing: float = 0.0
    """sigmoid and robust: assumed probability eps that a pair's label is flipped; sigmoid
    computes conservative DPO (cDPO, soft labels), robust rDPO (unbiased under flips)."""
    reduction: str = "auto"
    """Sequence log-prob: sum of token log-probs or their mean (length-normalised); auto picks the
    loss's published form (TRL's): mean for ipo, simpo, orpo, sum for sigmoid, robust, hinge, cpo,
    kto. sigmoid also takes mean (length-normalised DPO), ipo sum; other combinations are refused.
    The run's config.yaml records the resolved value. Logged rewards/* and logps/* of the losses with
    a reference (and kto) are on sums whatever this is, as TRL logs them."""
    nll_coef: float = 0.0
    """Weight of a per-token NLL term on the chosen response (RPO, https://arxiv.org/abs/2404.19733);
    0 is plain DPO."""
    ref_model_path: Optional[str] = None
    """Reference model folder; None means model.path (the policy's starting point)."""
    precompute_ref: bool = False
    """Compute reference log-probs once, cache them in run_dir/ref_logps.pt, and free the reference."""


@dataclass
class RMParams:
    score_eos: bool = False
    """Score at the EOS after the response (True) or at the response's last token (False, as the
    RL reward scorer reads decoded text without EOS)."""
    center_rewards_coef: float = 0.0
    """Weight of a (r_chosen + r_rejected)^2 penalty that keeps rewards centred on zero."""


@dataclass
class PrefTrainerConfig(SupervisedRunConfig):
    run_dir: str = "runs/pref"
    """Run directory: config, metrics, checkpoints, hf export."""


@dataclass
class _PrefConfig(RootConfig):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: PrefDataConfig = field(default_factory=PrefDataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The shared optimizer section with its defaults (lr 1e-5, constant schedule)."""
    trainer: PrefTrainerConfig = field(default_factory=PrefTrainerConfig)

    model_path_keys: ClassVar[tuple[str, ...]] = ("model.path", "model.tokenizer_path")
    """The keys that name model folders (a Hub id among them is resolved: models/hub.py)."""


@dataclass
class DPOConfig(_PrefConfig):
    dpo: DPOParams = field(default_factory=DPOParams)
    eval: GenEvalConfig = field(default_factory=GenEvalConfig)

    model_path_keys: ClassVar[tuple[str, ...]] = ("model.path", "model.tokenizer_path", "dpo.ref_model_path")


@dataclass
class RMConfig(_PrefConfig):
    rm: RMParams = field(default_factory=RMParams)


def validate_preference(cfg: _PrefConfig) -> _PrefConfig:
    """Check the rules about `cfg`'s values; returns it unchanged."""
    d = cfg.data
    check_ranges(cfg)
    check_model_path(cfg.model.path, "model.path")
    dpo = cfg if isinstance(cfg, DPOConfig) else None
    if dpo is not None:
        normalize_reward_functions(dpo.eval.reward_functions, "eval.reward_functions")
        from reinforge.algos.preference import (  # imports torch, as training does
            DPO_LOSS_TYPES, PAIRED_WITH_REFERENCE, REFERENCE_FREE, UNPAIRED)

        p = dpo.dpo
        need(p.loss_type in DPO_LOSS_TYPES,
             f"dpo.loss_type={p.loss_type!r} is not known; valid: {list(PAIRED_WITH_REFERENCE)}, the reference-free "
             f"{list(REFERENCE_FREE)} or the unpaired {list(UNPAIRED)}")
        need(p.reduction in REDUCTIONS, f"dpo.reduction={p.reduction!r} is not known; valid: {list(REDUCTIONS)}")
        allowed = LOSS_REDUCTIONS[p.loss_type]
        hint = REDUCTION_HINTS.get((p.loss_type, p.reduction))
        need(p.reduction == "auto" or p.reduction in allowed,
             f"dpo.reduction={p.reduction} has no published meaning with dpo.loss_type={p.loss_type}, which is "
             f"defined on {' or '.join(allowed)} log-probs: set dpo.reduction=auto"
             + (f" ({hint})" if hint else ""))
        need(p.label_smoothing == 0 or p.loss_type in ("sigmoid", "robust"),
             f"dpo.label_smoothing={p.label_smoothing} applies to dpo.loss_type=sigmoid (cDPO) or robust (rDPO), "
             f"not {p.loss_type!r}")
        need(p.loss_type not in UNPAIRED or not (p.precompute_ref or p.nll_coef),
             f"dpo.loss_type={p.loss_type} scores the reference on each batch's mismatched pairs and has no "
             "chosen response: unset dpo.precompute_ref and dpo.nll_coef")
        need(p.loss_type not in UNPAIRED or d.batch_size >= 2,
             f"dpo.loss_type={p.loss_type} estimates its KL term from mismatched pairs: set data.batch_size >= 2")
        need(p.loss_type not in REFERENCE_FREE or not (p.ref_model_path or p.precompute_ref),
             f"dpo.loss_type={p.loss_type} uses no reference model: unset dpo.ref_model_path and dpo.precompute_ref")
        if p.ref_model_path:
            check_model_path(p.ref_model_path, "dpo.ref_model_path")
    validate_supervised(cfg, dpo.eval if dpo is not None else None)
    return cfg


def resolve_preference(cfg: _PrefConfig) -> _PrefConfig:
    """`cfg` (already validated) with its derived settings resolved, as a new config: DPO's
    dpo.reduction=auto becomes the loss type's reduction (the value config.yaml records)."""
    if not isinstance(cfg, DPOConfig):
        return cfg
    return replace(cfg, dpo=replace(cfg.dpo, reduction=resolved_reduction(cfg.dpo.loss_type, cfg.dpo.reduction)))
