"""Reward shaping added to the reward functions' score: length penalties (Kimi k1.5's group-relative
one, a plain per-token one), a format bonus/penalty, DAPO's soft overlong punishment, and an
optional clip, combined in one documented order (`shape_scores`; docs/rewards.md, "Reward shaping").

Pure functions on (B,) tensors and plain numbers; `apply_shaping` reads the config keys.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

import torch

from reinforge.algos.overlong import soft_overlong_penalty
from reinforge.rewards.builtin import format_reward

LENGTH_PENALTIES = ("none", "kimi", "per_token")


def kimi_length_reward(lengths: torch.Tensor, correct: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Kimi k1.5's length reward (arXiv:2501.12599, section 2.3.3), unweighted.

    lengths (B,) response tokens, correct (B,) bool, group_ids (B,) -> (B,) float. Within each
    group (the samples of one prompt), lambda_i = 0.5 - (L_i - L_min) / (L_max - L_min): +0.5 for
    the group's shortest response, -0.5 for its longest. A correct response gets lambda, an
    incorrect one min(0, lambda) (a short wrong answer is not rewarded for being short). A group
    whose responses all have one length gets 0 (the paper leaves L_max = L_min undefined).
    """
    L = lengths.float()
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1 if len(inv) else 0
    lo = torch.full((n,), float("inf")).scatter_reduce(0, inv, L, "amin")[inv]
    hi = torch.full((n,), -float("inf")).scatter_reduce(0, inv, L, "amax")[inv]
    span = hi - lo
    lam = torch.where(span > 0, 0.5 - (L - lo) / span.clamp(min=1e-12), torch.zeros_like(L))
    return torch.where(correct.bool(), lam, lam.clamp(max=0.0))


def per_token_length_penalty(lengths: torch.Tensor, free_tokens: int, coef: float) -> torch.Tensor:
    """-coef per response token beyond the first `free_tokens`: lengths (B,) -> (B,) float <= 0."""
    return -coef * (lengths.float() - free_tokens).clamp(min=0.0)


def length_term(kind: str, lengths: torch.Tensor, correct: torch.Tensor, group_ids: Optional[torch.Tensor],
                coef: float, free_tokens: int) -> torch.Tensor:
    """The configured length term (B,): coef * Kimi's reward (group_ids None: one group), the
    per-token penalty, or zeros."""
    if kind == "kimi":
        groups = group_ids if group_ids is not None else torch.zeros(lengths.shape, dtype=torch.long)
        return coef * kimi_length_reward(lengths, correct, groups)
    if kind == "per_token":
        return per_token_length_penalty(lengths, free_tokens, coef)
    if kind == "none":
        return torch.zeros(lengths.shape, dtype=torch.float32)
    raise ValueError(f"unknown length penalty {kind!r}; choose one of {', '.join(LENGTH_PENALTIES)}")


# Built-in format checkers: response text -> well formed? Each is a single regex match or the
# `format` reward's scan, linear in the response.
_THINK_ANSWER = re.compile(r"\s*<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)+</answer>\s*",
                           re.DOTALL)
_BOXED = re.compile(r"\\boxed\{[^{}\s][^{}]*\}")
FORMAT_CHECKERS: dict[str, Callable[[str], bool]] = {
    "think": lambda text: format_reward("", text) == 1.0,
    "think_answer": lambda text: _THINK_ANSWER.fullmatch(text) is not None,
    "boxed": lambda text: _BOXED.search(text) is not None,
}
REGEX_PREFIX = "re:"


def format_checker(spec: str) -> Callable[[str], bool]:
    """A checker from a built-in name (FORMAT_CHECKERS) or "re:<regex>" (the whole response must
    match: re.fullmatch with DOTALL). ValueError for an unknown name or a regex that does not compile."""
    if spec.startswith(REGEX_PREFIX):
        try:
            pattern = re.compile(spec[len(REGEX_PREFIX):], re.DOTALL)
        except re.error as exc:
            raise ValueError(f"{spec!r} is not a valid regular expression: {exc}") from None
        return lambda text: pattern.fullmatch(text) is not None
    if spec not in FORMAT_CHECKERS:
        raise ValueError(f"unknown format checker {spec!r}; built-ins: {', '.join(FORMAT_CHECKERS)}, "
                         f"or '{REGEX_PREFIX}<regex>' that the whole response must match")
    return FORMAT_CHECKERS[spec]


def shape_scores(task: torch.Tensor, *, well_formed: Optional[torch.Tensor] = None, format_score: float = 0.0,
                 format_penalty: float = 0.0, overlong: Optional[torch.Tensor] = None,
                 length: Optional[torch.Tensor] = None, clip_min: Optional[float] = None,
                 clip_max: Optional[float] = None) -> torch.Tensor:
    """The shaped score (B,), in this order:

        s = task + (format_score if well formed else -format_penalty) + overlong + length
        s = clamp(s, clip_min, clip_max)        (a None bound is open)

    task (B,): the reward functions' weighted sum (plus the reward model's score); well_formed
    (B,) bool or None (no format term); overlong (B,) <= 0: DAPO's soft punishment; length (B,):
    the length term. Every term is added before the one clip, so a truncated, ill-formed response
    collects both penalties and the clip bounds how low they go together.
    """
    s = task.float().clone()
    if well_formed is not None:
        s += torch.where(well_formed.bool(), torch.tensor(float(format_score)), torch.tensor(-float(format_penalty)))
    for term in (overlong, length):
        if term is not None:
            s += term.float()
    if clip_min is not None or clip_max is not None:
        s = s.clamp(min=clip_min, max=clip_max)
    return s


def apply_shaping(task: torch.Tensor, texts: list[str], lengths: torch.Tensor, correct: torch.Tensor,
                  group_ids: Optional[torch.Tensor], cfg, algo, max_response_length: int
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """shape_scores with the terms `cfg` (RewardConfig) and `algo` (AlgorithmConfig: DAPO's
    overlong keys) switch on. -> (scores (B,), metrics): reward/format_ok_frac,
    reward/overlong_penalty_mean, reward/length_penalty_mean, reward/clipped_frac for the terms in use."""
    metrics: dict[str, float] = {}
    well_formed = overlong = length = None
    if cfg.format.check:
        check = format_checker(cfg.format.check)
        well_formed = torch.tensor([check(t) for t in texts], dtype=torch.bool)
        metrics["reward/format_ok_frac"] = float(well_formed.float().mean()) if len(texts) else 0.0
    if algo.overlong_buffer_len > 0:
        overlong = soft_overlong_penalty(lengths.float(), max_response_length, algo.overlong_buffer_len,
                                         algo.overlong_penalty_factor)
        metrics["reward/overlong_penalty_mean"] = float(overlong.mean())
    lp = cfg.length_penalty
    if lp.kind != "none":
        length = length_term(lp.kind, lengths, correct, group_ids, lp.coef, lp.free_tokens)
        metrics["reward/length_penalty_mean"] = float(length.mean())
    out = shape_scores(task, well_formed=well_formed, format_score=cfg.format.score,
                       format_penalty=cfg.format.penalty, overlong=overlong, length=length)
    if cfg.clip_min is not None or cfg.clip_max is not None:
        # The one clip of shape_scores, applied here so the unclipped sum is not computed twice.
        unclipped, out = out, out.clamp(min=cfg.clip_min, max=cfg.clip_max)
        metrics["reward/clipped_frac"] = float((unclipped != out).float().mean())
    return out, metrics
