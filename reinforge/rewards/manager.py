"""RewardManager: weighted reward functions run with timeouts and error containment."""

from __future__ import annotations

import math
import pickle
import sys
import threading
import time
from typing import Any, Callable

from reinforge.config.schema import RewardConfig
from reinforge.rewards.pool import ERROR, OK, TIMEOUT, TimeoutPool
from reinforge.rewards.registry import load_reward_fn

_DEFAULTS = RewardConfig()  # the schema holds the defaults; the manager only reads them


class RewardError(RuntimeError):
    """Too many reward calls failed in one batch (a bug, not noise): stop rather than train on defaults."""


def _normalize(value: Any) -> tuple[float, dict[str, float]]:
    """(score, extra numeric metrics) from a float / int / bool or a dict with "score"."""
    extras: dict[str, float] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"reward dict has no 'score' key (keys: {sorted(value)[:8]})")
        extras = {k: float(v) for k, v in value.items() if k != "score" and isinstance(v, (int, float))}
        value = value["score"]
    if not isinstance(value, (int, float)):
        raise TypeError(f"reward must be a number or a dict with 'score', got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"reward is not finite: {value}")
    return float(value), extras


def _call_in_thread(fn: Callable, args: tuple, timeout: float | None):
    """fn(*args) in a daemon thread; TimeoutError after `timeout` seconds.

    A thread cannot be killed, so a hung call is abandoned. It is a daemon thread (unlike
    ThreadPoolExecutor's workers, which interpreter exit joins) so it cannot block shutdown.
    """
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name="reward-batched", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Fn:
    def __init__(self, spec, weight: float, names: set[str]):
        self.fn: Callable = load_reward_fn(spec)
        self.weight = float(weight)
        self.batched = bool(getattr(self.fn, "batched", False))
        # Built-ins that bound their own time (size caps, a parse budget) may skip the worker round trip.
        self.bounded = bool(getattr(self.fn, "bounded", False))
        base = spec if isinstance(spec, str) and ":" not in spec and "/" not in spec else getattr(self.fn, "__name__", "fn")
        base = base.rsplit(".", 1)[-1]
        self.name = base if base not in names else f"{base}_{len(names)}"
        # Workers receive the spec string (they import it themselves) or the pickled function.
        self.ref = spec if isinstance(spec, str) else self.fn


class RewardManager:
    """score(prompts, responses, ground_truths, extras) -> (scores, metrics).

    score_i = sum_f weight_f * f(prompt_i, response_i, ground_truth_i, **extras_i).
    Per-sample functions run in `num_workers` processes, each call killed after `timeout_s`.
    num_workers=0: functions marked `bounded = True` (the built-in verifiers, whose own caps
    bound each call) run in this process, sequentially, with no round trip; every other
    per-sample function still goes to one worker process, so that a call that never returns
    is killed at `timeout_s` rather than hanging the run. Batched functions (attribute
    `batched = True`) run in a thread with `batched_timeout_s` (default timeout_s per sample;
    a thread cannot be killed, so a hung one is abandoned). A call that raises or times out
    scores `default_score` and is counted in `reward/errors` / `reward/timeouts` (time-outs
    are also reported on stderr); if more than `max_error_rate` of one function's calls in a
    batch fail, RewardError names it and its first failure.
    Defaults are RewardConfig's (reinforge.config.schema).
    Metrics: reward/<fn>/mean, reward/<key> (mean of extra numeric keys of dict results),
    reward/errors, reward/timeouts.
    """

    def __init__(
        self,
        specs: list,
        *,
        num_workers: int = _DEFAULTS.num_workers,
        timeout_s: float = _DEFAULTS.timeout_s,
        default_score: float = _DEFAULTS.default_score,
        max_error_rate: float = _DEFAULTS.max_error_rate,
        batched_timeout_s: float | None = None,
    ):
        if not specs:
            raise ValueError("RewardManager needs at least one reward function")
        self.fns: list[_Fn] = []
        for item in specs:
            spec, weight = item if isinstance(item, (tuple, list)) else (item, 1.0)
            self.fns.append(_Fn(spec, weight, {f.name for f in self.fns}))
        self.timeout_s, self.default_score, self.max_error_rate = timeout_s, default_score, max_error_rate
        self.batched_timeout_s = batched_timeout_s
        self.num_workers = num_workers
        self._pool = None
        pooled = [f for f in self.fns if not f.batched and (num_workers > 0 or not f.bounded)]
        for f in pooled:
            if not isinstance(f.ref, str):
                try:
                    pickle.dumps(f.ref)
                except Exception as exc:
                    raise ValueError(
                        f"reward function '{f.name}' cannot be sent to a worker process ({exc}), which "
                        "its timeout needs; give it as 'module:fn' or 'file.py:fn', or, for a function "
                        "that bounds its own time, set its attribute bounded = True (num_workers=0 only)"
                    ) from exc
        if pooled:
            # Workers resolve string specs and import declared heavy modules before taking work
            # (started on first use: a run that never scores never starts one).
            specs = [f.ref for f in pooled if isinstance(f.ref, str)]
            modules = sorted({m for f in pooled for m in getattr(f.fn, "preload_modules", ())})
            self._pool = TimeoutPool(max(1, num_workers), timeout_s, preload_specs=specs, preload_modules=modules)

    def _run_per_sample(self, f: _Fn, prompts, responses, gts, extras) -> list[tuple[str, Any]]:
        calls = [(f.ref, (p, r, g), dict(e)) for p, r, g, e in zip(prompts, responses, gts, extras)]
        if self.num_workers > 0 or not f.bounded:
            return self._pool.run(calls)
        out = []
        for _, args, kwargs in calls:
            start = time.monotonic()
            try:
                out.append((OK, f.fn(*args, **kwargs)))
            except Exception as exc:  # noqa: BLE001 - contained and counted
                out.append((ERROR, f"{type(exc).__name__}: {exc}"))
            # Not interruptible here, but a bounded function that still overran scores as a time-out.
            elapsed = time.monotonic() - start
            if elapsed > self.timeout_s:
                out[-1] = (TIMEOUT, f"took {elapsed:.1f}s in-process (timeout_s={self.timeout_s:g})")
        return out

    def _run_batched(self, f: _Fn, prompts, responses, gts, extras) -> list[tuple[str, Any]]:
        n = len(prompts)
        timeout = self.batched_timeout_s or self.timeout_s * max(1, n)
        try:
            values = _call_in_thread(f.fn, (list(prompts), list(responses), list(gts), list(extras)), timeout)
        except TimeoutError:
            return [(TIMEOUT, f"batched call timed out after {timeout:g}s")] * n
        except Exception as exc:  # noqa: BLE001
            return [(ERROR, f"{type(exc).__name__}: {exc}")] * n
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            return [(ERROR, f"batched reward returned {got}, expected a list of {n}")] * n
        return [(OK, v) for v in values]

    def score(self, prompts, responses, ground_truths, extras=None) -> tuple[list[float], dict[str, float]]:
        n = len(prompts)
        if not (len(responses) == len(ground_truths) == n):
            raise ValueError(f"lengths differ: {n} prompts, {len(responses)} responses, {len(ground_truths)} ground truths")
        extras = [dict(e or {}) for e in extras] if extras is not None else [{} for _ in range(n)]
        totals = [0.0] * n
        metrics: dict[str, float] = {"reward/errors": 0.0, "reward/timeouts": 0.0}
        sums: dict[str, list[float]] = {}
        for f in self.fns:
            run = self._run_batched if f.batched else self._run_per_sample
            results = run(f, prompts, responses, ground_truths, extras)
            scores, failures, first = [], 0, None
            for status, value in results:
                if status == OK:
                    try:
                        s, ex = _normalize(value)
                        for k, v in ex.items():
                            sums.setdefault(f"reward/{k}", []).append(v)
                    except (TypeError, ValueError) as exc:
                        status, value = ERROR, f"{type(exc).__name__}: {exc}"
                if status != OK:
                    s, failures, first = self.default_score, failures + 1, first or value
                    metrics["reward/timeouts" if status == TIMEOUT else "reward/errors"] += 1
                scores.append(s)
            timeouts = sum(status == TIMEOUT for status, _ in results)
            if timeouts:
                print(f"[reinforge] reward '{f.name}': {timeouts}/{n} calls timed out and scored "
                      f"{self.default_score:g}: {next(v for st, v in results if st == TIMEOUT)}", file=sys.stderr)
            if n and failures / n > self.max_error_rate:
                raise RewardError(
                    f"reward function '{f.name}' failed on {failures}/{n} samples "
                    f"(max_error_rate={self.max_error_rate}); first failure: {first}"
                )
            metrics[f"reward/{f.name}/mean"] = sum(scores) / n if n else 0.0
            totals = [t + f.weight * s for t, s in zip(totals, scores)]
        metrics.update({k: sum(v) / len(v) for k, v in sums.items()})
        return totals, metrics

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> "RewardManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
