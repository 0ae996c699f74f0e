"""Reward shaping added to the reward functions' score: a format bonus/penalty, DAPO's soft
overlong punishment, length terms (Kimi k1.5's group-relative one, a plain per-token one) and an
optional clip, applied in one documented order (docs/rewards.md, "Reward shaping"):

    s = task + format + overlong + length;  s = clamp(s, clip_min, clip_max)

Each term is one entry of SHAPING_TERMS (in the order applied) that owns its parameters (the
config section it reads), their validation and its application; `Shaping` is the terms a run
switches on. The pure functions on (B,) tensors and plain numbers come first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from reinforge.algos.overlong import soft_overlong_penalty
from reinforge.config.load import ConfigError
from reinforge.config.schema import AlgorithmConfig, FormatConfig, LengthPenaltyConfig, RewardConfig
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


def format_term(well_formed: torch.Tensor, score: float, penalty: float) -> torch.Tensor:
    """(B,) bool -> (B,): +score where well formed, -penalty elsewhere."""
    return torch.where(well_formed.bool(), torch.tensor(float(score)), torch.tensor(-float(penalty)))


def shape_scores(task: torch.Tensor, *, well_formed: Optional[torch.Tensor] = None, format_score: float = 0.0,
                 format_penalty: float = 0.0, overlong: Optional[torch.Tensor] = None,
                 length: Optional[torch.Tensor] = None, clip_min: Optional[float] = None,
                 clip_max: Optional[float] = None) -> torch.Tensor:
    """The shaped score (B,) from precomputed terms, in SHAPING_TERMS' order:

        s = task + (format_score if well formed else -format_penalty) + overlong + length
        s = clamp(s, clip_min, clip_max)        (a None bound is open)

    task (B,): the reward functions' weighted sum (plus the reward model's score); well_formed
    (B,) bool or None (no format term); overlong (B,) <= 0: DAPO's soft punishment; length (B,):
    the length term. Every term is added before the one clip, so a truncated, ill-formed response
    collects both penalties and the clip bounds how low they go together.
    """
    s = task.float()
    if well_formed is not None:
        s = s + format_term(well_formed, format_score, format_penalty)
    for term in (overlong, length):
        if term is not None:
            s = s + term.float()
    if clip_min is not None or clip_max is not None:
        s = s.clamp(min=clip_min, max=clip_max)
    return s


# ---- the registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShapingInput:
    """What the terms read about B scored responses."""

    texts: list[str]
    """(B,) the decoded responses (format checks)."""
    lengths: torch.Tensor
    """(B,) generated tokens of each response."""
    correct: torch.Tensor
    """(B,) bool, correctness before shaping (Kimi's length reward)."""
    group_ids: Optional[torch.Tensor]
    """(B,) the prompt groups, or None (one group)."""


@dataclass(frozen=True)
class OverlongParams:
    """DAPO's soft overlong punishment: algorithm.overlong_buffer_len / overlong_penalty_factor."""

    buffer_len: int
    """The last tokens before rollout.max_response_length over which the penalty ramps; 0: off."""
    penalty_factor: float
    """The penalty at the maximum length."""
    max_response_length: int
    """rollout.max_response_length."""


@dataclass(frozen=True)
class ClipParams:
    """reward.clip_min / reward.clip_max: bounds of the shaped score (None: open)."""

    min: Optional[float]
    """Lower bound after every term."""
    max: Optional[float]
    """Upper bound after every term."""


@dataclass(frozen=True)
class ShapingTerm:
    """One shaping term: its parameters (read from the config), when it is on, how they are
    checked (ConfigError naming the key) and how it changes the score (B,) -> ((B,), metrics)."""

    name: str
    read: Callable[[RewardConfig, AlgorithmConfig, int], Any]
    """(reward section, algorithm section, rollout.max_response_length) -> its params dataclass."""
    active: Callable[[Any], bool]
    check: Callable[[Any], None]
    apply: Callable[[torch.Tensor, ShapingInput, Any], tuple[torch.Tensor, dict[str, float]]]


def _check_format(p: FormatConfig) -> None:
    if p.check:
        try:
            format_checker(p.check)
        except ValueError as exc:
            raise ConfigError(f"reward.format.check: {exc}") from None


def _apply_format(s, inp: ShapingInput, p: FormatConfig):
    check = format_checker(p.check)
    well_formed = torch.tensor([check(t) for t in inp.texts], dtype=torch.bool)
    ok = float(well_formed.float().mean()) if len(inp.texts) else 0.0
    return s + format_term(well_formed, p.score, p.penalty), {"reward/format_ok_frac": ok}


def _check_overlong(p: OverlongParams) -> None:
    if not 0 <= p.buffer_len < p.max_response_length:
        raise ConfigError(f"algorithm.overlong_buffer_len={p.buffer_len} must be in [0, rollout.max_response_length="
                          f"{p.max_response_length})")


def _apply_overlong(s, inp: ShapingInput, p: OverlongParams):
    pen = soft_overlong_penalty(inp.lengths.float(), p.max_response_length, p.buffer_len, p.penalty_factor)
    return s + pen, {"reward/overlong_penalty_mean": float(pen.mean())}


def _check_length(p: LengthPenaltyConfig) -> None:
    if p.kind not in LENGTH_PENALTIES:
        *rest, last = LENGTH_PENALTIES
        raise ConfigError(f"reward.length_penalty.kind={p.kind!r}: {', '.join(rest)} or {last}")


def _apply_length(s, inp: ShapingInput, p: LengthPenaltyConfig):
    term = length_term(p.kind, inp.lengths, inp.correct, inp.group_ids, p.coef, p.free_tokens)
    return s + term, {"reward/length_penalty_mean": float(term.mean())}


def _check_clip(p: ClipParams) -> None:
    if p.min is not None and p.max is not None and not p.min < p.max:
        raise ConfigError(f"reward.clip_min={p.min} must be below reward.clip_max={p.max}")


def _apply_clip(s, inp: ShapingInput, p: ClipParams):
    out = s.clamp(min=p.min, max=p.max)
    return out, {"reward/clipped_frac": float((s != out).float().mean())}


SHAPING_TERMS: dict[str, ShapingTerm] = {}  # in the order applied


def register_term(term: ShapingTerm, *, before: str | None = None) -> ShapingTerm:
    """Add a shaping term, applied after the registered ones (or just before `before`)."""
    if term.name in SHAPING_TERMS:
        raise ValueError(f"shaping term {term.name!r} is already registered")
    items = list(SHAPING_TERMS.items())
    at = len(items) if before is None else [k for k, _ in items].index(before)
    items.insert(at, (term.name, term))
    SHAPING_TERMS.clear()
    SHAPING_TERMS.update(items)
    return term


register_term(ShapingTerm("format", lambda rw, algo, T: rw.format, lambda p: bool(p.check), _check_format,
                          _apply_format))
register_term(ShapingTerm(
    "overlong", lambda rw, algo, T: OverlongParams(algo.overlong_buffer_len, algo.overlong_penalty_factor, T),
    lambda p: p.buffer_len > 0, _check_overlong, _apply_overlong))
register_term(ShapingTerm("length", lambda rw, algo, T: rw.length_penalty, lambda p: p.kind != "none",
                          _check_length, _apply_length))
# The one clip, last: it bounds the sum of every term before it.
register_term(ShapingTerm("clip", lambda rw, algo, T: ClipParams(rw.clip_min, rw.clip_max),
                          lambda p: p.min is not None or p.max is not None, _check_clip, _apply_clip))


def check_shaping(reward: RewardConfig, algo: AlgorithmConfig, max_response_length: int) -> None:
    """Every term's parameters checked (a ConfigError naming the key), whether on or not."""
    for term in SHAPING_TERMS.values():
        term.check(term.read(reward, algo, max_response_length))


class Shaping:
    """The shaping terms a run switches on, with their parameters, read once from the config."""

    def __init__(self, reward: RewardConfig, algo: AlgorithmConfig, max_response_length: int):
        params = [(t, t.read(reward, algo, max_response_length)) for t in SHAPING_TERMS.values()]
        self.terms = [(t, p) for t, p in params if t.active(p)]

    def __call__(self, task: torch.Tensor, inp: ShapingInput) -> tuple[torch.Tensor, dict[str, float]]:
        """task (B,) the rule-based score plus the reward model's -> (shaped (B,), metrics of the terms on)."""
        s, metrics = task.float(), {}
        for term, p in self.terms:
            s, m = term.apply(s, inp, p)
            metrics.update(m)
        return s, metrics
