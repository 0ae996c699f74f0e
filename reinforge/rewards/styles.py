"""The three reward-function styles: which one a function is written in, and how it is called.

    reinforge  fn(prompt, response, ground_truth, **extra) -> float | dict        one sample a call
               batched (fn.batched = True): fn(prompts, responses, ground_truths, extras) -> list
    verl       compute_score(data_source, solution_str, ground_truth, extra_info=None)
               -> float | dict with "score"                                       one sample a call
               veRL's batch form compute_score(data_sources, solution_strs, ground_truths,
               extra_infos) -> list                                                one call a batch
    trl        fn(prompts, completions, completion_ids=None, **columns)
               -> list[float | None]                                               one call a batch

The style is read from the parameter names (`solution_str(s)`: verl; `completions`: trl;
anything else: reinforge) unless a reward.functions entry forces it with `style:`. veRL and TRL
call their functions with keywords, so the names are what those frameworks require too.

What each style receives, from a dataset row (see reinforge.data.RLDataset):
- reinforge: the rendered prompt text, the response text, the ground truth and every other
  column as a keyword (`data_source` included);
- verl: `data_source`, the response as `solution_str`, the ground truth and the row's
  `extra_info` column (an empty dict when the row has none), each only when the function names
  it or takes **kwargs (veRL's per-dataset scorers, e.g. compute_score(solution_str,
  ground_truth, method="strict"), take no data_source);
- trl: the prompts as in the row (a string, or the message list of a conversational prompt),
  the completions as strings, or as `[{"role": "assistant", "content": text}]` when the prompt
  is a message list, the completions' token ids, and every column but the prompt as a keyword
  holding one value per sample (`ground_truth` and `data_source` are added when the row has no
  such column). A function without **kwargs gets only the keywords it names.
A TRL function may return None for a sample it does not apply to (see RewardManager).

Each style is one entry of STYLES (a RewardStyle: how it is detected, whether a function of it
scores a batch per call, how it is called, its signatures and how a signature is checked);
`register_style` adds one (docs/extending.md). `style_choices()` are the names a
reward.functions entry's `style:` takes: "auto" (detect) and every registered style.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

# RLDataset-built items may carry their raw row in extra[ROW_KEY] = (prompt column, row), so
# that TRL-style functions see the prompt and the columns as the file holds them. It is taken
# out of `extra` before any other style sees it.
ROW_KEY = "__row__"
AUTO = "auto"  # the style: key that detects the style from the signature
TRL_RESERVED = ("prompts", "completions", "completion_ids")


def _parameters(fn: Callable) -> dict[str, inspect.Parameter] | None:
    """fn's parameters, or None when Python cannot read its signature (C functions)."""
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def detect_style(fn: Callable) -> str:
    """The first registered style whose `detect` accepts fn's parameter names (reinforge, the
    fallback, when none does or fn sets `batched`, reinforge's own batch marker)."""
    if getattr(fn, "batched", False):
        return "reinforge"
    params = _parameters(fn) or {}
    return next((st.name for st in STYLES.values() if st.detect is not None and st.detect(params)), "reinforge")


def _is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


@dataclass(frozen=True)
class Calling:
    """How one reward function is called: its style, whether one call scores the whole batch,
    whether it is `async def`, and the keyword names it takes (None: any, it has **kwargs)."""

    style: str
    batched: bool
    is_async: bool
    accepts: frozenset | None
    named: frozenset = frozenset()
    """The parameter names it declares (with or without **kwargs)."""

    @property
    def entry(self) -> "RewardStyle":
        return STYLES[self.style]

    @property
    def signature(self) -> str:
        st = self.entry
        return st.batched_signature if self.batched and st.batched_signature else st.signature


def calling(fn: Callable, style: str | None = None) -> Calling:
    """The Calling of `fn`; `style` forces one (None or "auto" detects it)."""
    style = detect_style(fn) if style in (None, AUTO) else style
    if style not in STYLES:
        raise ValueError(f"unknown reward style {style!r}; styles: {', '.join(STYLES)}")
    params = _parameters(fn)
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        accepts = None
    else:
        accepts = frozenset(n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    batched = STYLES[style].batched(fn, params)
    named = frozenset(params or ())
    return Calling(style, batched, _is_async(fn), accepts, named)


def public_extra(extra: dict) -> dict:
    """`extra` without the keys reinforge keeps for itself (ROW_KEY)."""
    return {k: v for k, v in extra.items() if k != ROW_KEY}


def _accepted(c: Calling, kwargs: dict) -> dict:
    return kwargs if c.accepts is None else {k: v for k, v in kwargs.items() if k in c.accepts}


def _verl_extra_info(extra: dict):
    return extra.get("extra_info") if extra.get("extra_info") is not None else {}


def accepts_trajectory(c: Calling, batched: bool = False) -> bool:
    """Whether the function names `trajectory` (per sample) / `trajectories` (batched), the
    agent loop's episodes (reinforge.agents.loop); **kwargs is not enough: a function that
    passes its keywords on should not receive a large extra object unasked."""
    return ("trajectories" if batched else "trajectory") in c.named


def _trajectory_kw(c: Calling, trajectory: dict | None) -> dict:
    return {"trajectory": trajectory} if trajectory is not None and accepts_trajectory(c) else {}


def sample_call(c: Calling, prompt: str, response: str, ground_truth, extra: dict,
                trajectory: dict | None = None) -> tuple[tuple, dict]:
    """(args, kwargs) of one per-sample call in c's style; `trajectory` (a multi-turn episode)
    is passed as a keyword to functions that name it."""
    args, kwargs = c.entry.sample_call(c, prompt, response, ground_truth, extra)
    return args, {**kwargs, **_trajectory_kw(c, trajectory)}


def _reinforge_sample(c: Calling, prompt: str, response: str, ground_truth, extra: dict):
    return (prompt, response, ground_truth), public_extra(extra)


def _verl_sample(c: Calling, prompt: str, response: str, ground_truth, extra: dict):
    # veRL's own per-dataset scorers take fewer (gsm8k: solution_str, ground_truth, method=...):
    # a function gets the ones it names, all four with **kwargs.
    kwargs = {"data_source": extra.get("data_source"), "solution_str": response, "ground_truth": ground_truth,
              "extra_info": _verl_extra_info(extra)}
    return (), _accepted(c, kwargs)


def _trl_columns(prompt_texts: list[str], ground_truths: list, extras: list[dict]) -> tuple[list, dict[str, list]]:
    """(prompts, {column: one value per sample}) as TRL passes them: from each sample's raw row
    when the dataset kept it (ROW_KEY), else the prompt text and the extra keys."""
    prompts, rows = [], []
    for text, gt, extra in zip(prompt_texts, ground_truths, extras):
        if ROW_KEY in extra:
            prompt_key, row = extra[ROW_KEY]
            prompts.append(row.get(prompt_key, text))
            row = {k: v for k, v in row.items() if k != prompt_key}
        else:
            prompts.append(text)
            row = public_extra(extra)
        row.setdefault("ground_truth", gt)
        row.setdefault("data_source", extra.get("data_source"))
        rows.append(row)
    names = [k for k in dict.fromkeys(k for row in rows for k in row) if k not in TRL_RESERVED]
    return prompts, {k: [row.get(k) for row in rows] for k in names}


def batch_call(c: Calling, prompts: list[str], responses: list[str], ground_truths: list, extras: list[dict],
               completion_ids: list | None, trajectories: list | None = None) -> tuple[tuple, dict]:
    """(args, kwargs) of one call that scores a whole batch in c's style; `trajectories`
    (multi-turn episodes) go to functions that name that keyword."""
    traj = {"trajectories": list(trajectories)} if trajectories is not None and accepts_trajectory(c, True) else {}
    args, kwargs = c.entry.batch_call(c, prompts, responses, ground_truths, extras, completion_ids)
    return args, {**kwargs, **traj}


def _reinforge_batch(c: Calling, prompts, responses, ground_truths, extras, completion_ids):
    return (list(prompts), list(responses), list(ground_truths), [public_extra(e) for e in extras]), {}


def _verl_batch(c: Calling, prompts, responses, ground_truths, extras, completion_ids):
    kwargs = {"data_sources": [e.get("data_source") for e in extras], "solution_strs": list(responses),
              "ground_truths": list(ground_truths), "extra_infos": [_verl_extra_info(e) for e in extras]}
    return (), _accepted(c, kwargs)


def _trl_batch(c: Calling, prompts, responses, ground_truths, extras, completion_ids):
    raw_prompts, columns = _trl_columns(prompts, ground_truths, extras)
    conversational = [isinstance(p, (list, tuple)) for p in raw_prompts]
    completions = [[{"role": "assistant", "content": r}] if conv else r for r, conv in zip(responses, conversational)]
    kwargs = {"prompts": raw_prompts, "completions": completions, "completion_ids": completion_ids, **columns}
    return (), _accepted(c, kwargs)


def _bind_all(sig: inspect.Signature, c: Calling, args: tuple, kwargs: dict) -> None:
    sig.bind(*args, **kwargs)


def _bind_trl(sig: inspect.Signature, c: Calling, args: tuple, kwargs: dict) -> None:
    # other required parameters are dataset columns, known only at run time
    sig.bind_partial(*args, **kwargs)
    if c.accepts is not None and "completions" not in c.accepts:
        raise TypeError("it takes no 'completions'")


def signature_error(fn: Callable, c: Calling, forced: bool) -> str | None:
    """None when `fn` can be called as its style calls it; else why not, naming the signatures."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    extra = {"data_source": "source"}
    try:
        if c.batched:
            args, kwargs = batch_call(c, ["p"], ["r"], ["g"], [extra], [[0]])
        else:
            args, kwargs = sample_call(c, "p", "r", "g", extra)
        c.entry.check(sig, c, args, kwargs)
    except TypeError as exc:
        name = getattr(fn, "__name__", type(fn).__name__)
        if forced or c.style != "reinforge" or {"prompt", "response", "prompts", "responses"} & set(sig.parameters):
            return f"{name}{sig} cannot be called as {c.signature} ({c.style} style: {exc})"
        wanted = "; ".join(f"{st.name}: {st.signature}" for st in STYLES.values())
        return f"{name}{sig} fits no reward-function style ({exc}). Expected {wanted}; or set style: " \
               f"{'|'.join(STYLES)} in its reward.functions entry"
    return None


# ---- the registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardStyle:
    """One way of writing a reward function: how it is recognised and how it is called."""

    name: str
    signature: str
    """The per-call signature, as error messages and docs show it."""
    detect: Callable[[dict], bool] | None
    """Parameter names {name: inspect.Parameter} -> whether a function is in this style; None:
    never detected (reinforge, the fallback, or a style chosen only with `style:`)."""
    batched: Callable[[Callable, dict | None], bool]
    """(fn, its parameters or None) -> whether one call scores the whole batch."""
    batch_call: Callable[..., tuple[tuple, dict]]
    """(Calling, prompts, responses, ground_truths, extras, completion_ids) -> (args, kwargs)."""
    sample_call: Callable[..., tuple[tuple, dict]] | None = None
    """(Calling, prompt, response, ground_truth, extra) -> (args, kwargs); None: batched only."""
    batched_signature: str | None = None
    """The batch form's signature, where the style has both forms."""
    check: Callable[[inspect.Signature, Calling, tuple, dict], None] = _bind_all
    """Raises TypeError when the signature cannot take the probe call's (args, kwargs)."""


STYLES: dict[str, RewardStyle] = {}  # detection tries them in this order


def register_style(style: RewardStyle) -> RewardStyle:
    """Add a reward style (detected after the ones before it; `style:` names it in reward.functions)."""
    if style.name in STYLES or style.name == AUTO:
        raise ValueError(f"reward style {style.name!r} is already registered")
    STYLES[style.name] = style
    return style


def style_choices() -> tuple[str, ...]:
    """The values a reward.functions entry's `style:` takes: auto and every registered style."""
    return (AUTO, *STYLES)


register_style(RewardStyle(
    "reinforge", "fn(prompt, response, ground_truth, **extra)", None,
    lambda fn, params: bool(getattr(fn, "batched", False)), _reinforge_batch, _reinforge_sample,
    "fn(prompts, responses, ground_truths, extras) with fn.batched = True"))
register_style(RewardStyle(
    "verl", "compute_score(data_source, solution_str, ground_truth, extra_info=None)",
    lambda params: "solution_str" in params or "solution_strs" in params,
    lambda fn, params: params is not None and "solution_strs" in params, _verl_batch, _verl_sample,
    "compute_score(data_sources, solution_strs, ground_truths, extra_infos)"))
register_style(RewardStyle(
    "trl", "fn(prompts, completions, completion_ids=None, **kwargs) -> list", lambda params: "completions" in params,
    lambda fn, params: True, _trl_batch, check=_bind_trl))
