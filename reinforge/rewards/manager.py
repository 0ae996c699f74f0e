"""RewardManager: weighted reward functions of any style, run with timeouts and error containment."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import numbers
import pickle
import sys
import threading
import time
from typing import Any, Callable

from reinforge.config.schema import RewardConfig
from reinforge.rewards.pool import ERROR, OK, SKIPPED, TIMEOUT, TimeoutPool, hopeless
from reinforge.rewards.registry import PYTHON_PREFIX, load_reward_fn
from reinforge.rewards.scores import ACC_KEY, FunctionScores
from reinforge.rewards.styles import batch_call, calling, sample_call

_DEFAULTS = RewardConfig()  # the schema holds the defaults; the manager only reads them


class RewardError(RuntimeError):
    """Too many reward calls failed in one batch (a bug, not noise): stop rather than train on defaults."""


def _normalize(value: Any) -> tuple[float, dict[str, float]]:
    """(score, extra numeric metrics) from a real number (bool, int, float, numpy scalar) or a
    dict with "score" (an "acc" key, the function's correctness, is among the extras)."""
    extras: dict[str, float] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"reward dict has no 'score' key (keys: {sorted(value)[:8]})")
        extras = {k: float(v) for k, v in value.items() if k != "score" and isinstance(v, numbers.Real)}
        value = value["score"]
    if not isinstance(value, numbers.Real):  # numpy scalars included
        raise TypeError(f"reward must be a number or a dict with 'score', got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"reward is not finite: {value}")
    return float(value), extras


def _not_applicable(value: Any) -> bool:
    return value is None or (isinstance(value, numbers.Real) and math.isnan(value))


def _error(exc: BaseException) -> tuple[str, str]:
    return ERROR, f"{type(exc).__name__}: {exc}"


# What libraries say when they are called off the main thread and time themselves with
# signal.alarm (Python's own ValueError; math_verify's rewording of it).
_SIGNAL_IN_THREAD = ("signal only works in main thread", "threaded environment")


def _thread_hint(results: list[tuple[str, Any]], where: str | None) -> list[tuple[str, Any]]:
    """results, each error that comes from needing signals in a thread (the function ran in one
    because `where`) followed by the fix."""
    return [(status, _with_hint(value, where) if status == ERROR else value) for status, value in results]


def _with_hint(message: str, where: str | None) -> str:
    if where is not None and any(s in message for s in _SIGNAL_IN_THREAD):
        message += (f" [reinforge: this function runs in a thread ({where}), where signals do not work; define it "
                    "in a file and name it as 'path/file.py:fn' (or 'package.module:fn') so that a reward worker "
                    "process runs it on its main thread, or turn the library's signal timeouts off (math_verify: "
                    "parse(..., parsing_timeout=None), verify(..., timeout_seconds=None))]")
    return message


class _Overrun(Exception):
    """A call in a thread ran past its deadline (unlike a TimeoutError the function raises itself)."""


def _call_in_thread(fn: Callable, args: tuple, kwargs: dict, timeout: float):
    """fn(*args, **kwargs) in a daemon thread; _Overrun after `timeout` seconds.

    A thread cannot be killed, so a hung call is abandoned. It is a daemon thread (unlike
    ThreadPoolExecutor's workers, which interpreter exit joins) so it cannot block shutdown.
    """
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name="reward-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise _Overrun
    if "error" in box:
        # Popped and dropped here so that no cycle (the error's traceback -> this frame -> box ->
        # the error) keeps the thread alive until a garbage collection, whose weakref callbacks
        # could then run inside another caller's SIGALRM window (builtin.math_verify_reward).
        error = box.pop("error")
        try:
            raise error
        finally:
            del error
    return box["value"]


class _EventLoop:
    """One asyncio loop in a daemon thread for every `async def` reward function of a manager
    (one loop for the run, as clients such as AsyncOpenAI expect), started on first use."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="reward-async", daemon=True)
        self.thread.start()

    def run(self, calls: list[tuple[Callable, tuple, dict]], timeout: float) -> list[tuple[str, Any]]:
        """Await fn(*args, **kwargs) for every call concurrently, each cancelled after `timeout`.
        A loop that stays blocked (synchronous work inside an `async def`) past the deadline
        leaves its unfinished calls as time-outs."""
        results: list[tuple[str, Any] | None] = [None] * len(calls)

        async def one(i: int, fn: Callable, args: tuple, kwargs: dict) -> None:
            try:
                results[i] = (OK, await asyncio.wait_for(fn(*args, **kwargs), timeout))
            except asyncio.TimeoutError:
                results[i] = (TIMEOUT, f"timed out after {timeout:g}s")
            except Exception as exc:  # noqa: BLE001 - contained and counted
                results[i] = _error(exc)

        async def gather() -> None:
            await asyncio.gather(*(one(i, *call) for i, call in enumerate(calls)))

        future = asyncio.run_coroutine_threadsafe(gather(), self.loop)
        try:
            future.result(timeout + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
        return [r or (TIMEOUT, f"event loop blocked past {timeout:g}s") for r in results]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=1)
        if not self.thread.is_alive():
            self.loop.close()


def _sendable(fn: Callable, by_reference: bool = False) -> str | None:
    """None when a worker process can receive `fn`; else why not. A function of __main__ is
    picklable by name, but a worker would re-run the user's script to find it. by_reference:
    only a plain function (pickled by name), never an object whose state would be copied (a
    batched scorer holding a model, such as the LLM judge)."""
    if getattr(fn, "__module__", None) == "__main__":
        return "it is defined in __main__"
    if by_reference and not inspect.isfunction(fn):
        return f"it is a {type(fn).__name__} object, not a function a worker can import"
    try:
        pickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - lambdas, closures, local functions
        return f"it cannot be pickled ({type(exc).__name__})"
    return None


class _Fn:
    """One configured reward function: the callable, its style and where its calls run."""

    def __init__(self, spec, weight: float, style: str | None, names: set[str], num_workers: int):
        self.fn: Callable = load_reward_fn(spec)
        self.call = calling(self.fn, style)
        self.weight = float(weight)
        # Built-ins that bound their own time (size caps, a parse budget) may skip the worker round trip.
        self.bounded = bool(getattr(self.fn, "bounded", False))
        base = spec if isinstance(spec, str) and ":" not in spec and "/" not in spec else getattr(self.fn, "__name__", "fn")
        base = base.rsplit(".", 1)[-1]
        self.name = base if base not in names else f"{base}_{len(names)}"
        # Workers receive the spec string (they import it themselves) or the pickled function.
        by_name = isinstance(spec, str) and not spec.startswith(PYTHON_PREFIX)
        self.ref = spec if by_name else self.fn
        self.why_not_pooled = None
        if self.call.is_async:
            self.mode = "async"  # awaited concurrently on the manager's event loop
            self.why_not_pooled = "it is async def, awaited on the manager's event-loop thread"
        elif self.bounded and num_workers == 0 and not self.call.batched:
            self.mode = "inline"
        elif getattr(self.fn, "in_process", False):
            self.why_not_pooled = "it sets in_process = True"
            self.mode = "thread"
        else:
            # A batched call goes to a worker too (killable at its deadline, on a main thread where
            # signal-based timeouts work), but only by reference: its state is not copied.
            self.why_not_pooled = None if by_name else _sendable(self.fn, by_reference=self.call.batched)
            self.mode = "thread" if self.why_not_pooled else "pool"


def _parse_spec(item) -> tuple[Any, float, str | None]:
    """(spec, weight, style) from spec | (spec, weight) | (spec, weight, style) | {name, weight, style}."""
    if isinstance(item, dict):
        return item["name"], item.get("weight", 1.0), item.get("style")
    if isinstance(item, (tuple, list)):
        return (tuple(item) + (None,))[:3] if len(item) == 2 else tuple(item)
    return item, 1.0, None


class RewardManager:
    """score(prompts, responses, ground_truths, extras, completion_ids) -> FunctionScores.

    score_i = sum_f weight_f * f(sample i), each f called in its style (reinforge.rewards.styles:
    reinforge, veRL or TRL, detected from the signature unless given). Where calls run:
    - per-sample sync functions (reinforge, veRL) run in `num_workers` processes, each call
      killed after `timeout_s`. num_workers=0: functions marked `bounded = True` (the built-in
      verifiers, whose own caps bound each call) run in this process, sequentially, with no
      round trip; every other one still goes to one worker process, so that a call that never
      returns is killed at `timeout_s` rather than hanging the run. A function no worker can
      receive (a lambda or closure, or one defined in __main__, which a worker would find only
      by re-running the user's script) runs in this process, each call in a thread with
      `timeout_s` (a thread cannot be killed: a hung call is abandoned);
    - batched functions (TRL style, veRL's batch form, reinforge's `batched = True`) are called
      once per batch with `batched_timeout_s` (default timeout_s per sample), in a worker process
      (on its main thread, as TRL calls them: signal-based timeouts such as math_verify's work)
      when it can import them (a file or module spec, or a plain function outside __main__);
      otherwise, or when the function sets `in_process = True` (it holds a model, say), in a
      thread of this process;
    - `async def` functions of any style are awaited concurrently on one event loop (per-sample
      ones: the whole batch at once), each call cancelled after `timeout_s` (batched ones:
      `batched_timeout_s`).
    A call that raises or times out scores `default_score` and is counted in `reward/errors` /
    `reward/timeouts` (time-outs are also reported on stderr); if more than `max_error_rate` of
    one function's calls in a batch fail, RewardError names it and its first failure. Per-sample
    calls stop as soon as that is certain (the rest are not made), and after a time-out in a
    worker the batch's other calls run on up to pool.BURST_WORKERS workers side by side, so a
    function that hangs costs a few deadlines, not one per sample (pool.Schedule).
    A TRL-style function may return None for a sample it does not apply to: that term is left out
    of the sum (a nan-aware sum, as TRL's; the other functions' weights are not rescaled), the
    function's mean is over the samples it scored, and `reward/unscored` is the fraction of
    samples no function scored (their score is 0).
    Defaults are RewardConfig's (reinforge.config.schema; `from_config` reads a whole section).
    Metrics: reward/<fn>/mean, reward/<fn>/<key> (mean of the extra numeric keys of dict results),
    reward/unscored (with a TRL-style function), and the counts reward/errors, reward/timeouts.
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
            spec, weight, style = _parse_spec(item)
            self.fns.append(_Fn(spec, weight, style, {f.name for f in self.fns}, num_workers))
        self.timeout_s, self.default_score, self.max_error_rate = timeout_s, default_score, max_error_rate
        self.batched_timeout_s = batched_timeout_s
        self.num_workers = num_workers
        self._pool = None
        self._loop: _EventLoop | None = None
        for f in self.fns:
            # (not for objects such as the LLM judge, which hold what no worker should copy)
            if f.mode == "thread" and not getattr(f.fn, "in_process", False) and (
                    not f.call.batched or inspect.isfunction(f.fn)):
                print(f"[reinforge] reward '{f.name}' runs in this process, each call in a thread ({f.why_not_pooled}, "
                      f"so no worker process can run it): a call past timeout_s is abandoned, not killed; give it "
                      f"as 'file.py:fn' to have hung calls killed", file=sys.stderr)
        pooled = [f for f in self.fns if f.mode == "pool"]
        if pooled:
            # Workers resolve string specs and import declared heavy modules before taking work
            # (started on first use: a run that never scores never starts one).
            specs = [f.ref for f in pooled if isinstance(f.ref, str)]
            modules = sorted({m for f in pooled for m in getattr(f.fn, "preload_modules", ())})
            self._pool = TimeoutPool(max(1, num_workers), timeout_s, preload_specs=specs, preload_modules=modules)

    @classmethod
    def from_config(cls, specs: list, cfg: RewardConfig) -> "RewardManager":
        """A manager with the limits of a reward section (num_workers, timeout_s, default_score,
        max_error_rate)."""
        return cls(specs, num_workers=cfg.num_workers, timeout_s=cfg.timeout_s, default_score=cfg.default_score,
                   max_error_rate=cfg.max_error_rate)

    @property
    def functions(self) -> list[tuple[str, Callable]]:
        """(name, callable) of each configured function, in order."""
        return [(f.name, f.fn) for f in self.fns]

    def _batched_timeout(self, n: int) -> float:
        return self.batched_timeout_s or self.timeout_s * max(1, n)

    def _run_per_sample(self, f: _Fn, prompts, responses, gts, extras, trajectories=None) -> list[tuple[str, Any]]:
        trajectories = trajectories or [None] * len(prompts)
        calls = [sample_call(f.call, p, r, g, e, t) for p, r, g, e, t in zip(prompts, responses, gts, extras, trajectories)]
        if f.mode == "pool":
            return self._pool.run([(f.ref, args, kwargs) for args, kwargs in calls], max_error_rate=self.max_error_rate)
        if f.mode == "async":
            return _thread_hint(self._event_loop().run([(f.fn, args, kwargs) for args, kwargs in calls], self.timeout_s),
                                f.why_not_pooled)
        out = []
        threaded = f.mode == "thread"
        n = len(calls)
        for k, (args, kwargs) in enumerate(calls):
            failures = sum(status != OK for status, _ in out)
            if hopeless(failures, n, self.max_error_rate):  # the batch fails whatever the rest score
                why = f"not scored: {failures} of {n} calls had already failed (more than max_error_rate)"
                out.extend([(SKIPPED, why)] * (n - k))
                break
            start = time.monotonic()
            try:
                out.append((OK, _call_in_thread(f.fn, args, kwargs, self.timeout_s) if threaded else f.fn(*args, **kwargs)))
            except _Overrun:
                out.append((TIMEOUT, f"timed out after {self.timeout_s:g}s (abandoned in its thread)"))
                continue
            except Exception as exc:  # noqa: BLE001 - contained and counted
                out.append(_error(exc))
            # Not interruptible in-process, but a bounded function that still overran scores as a time-out.
            elapsed = time.monotonic() - start
            if elapsed > self.timeout_s:
                out[-1] = (TIMEOUT, f"took {elapsed:.1f}s in-process (timeout_s={self.timeout_s:g})")
        return _thread_hint(out, f.why_not_pooled) if threaded else out

    def _run_batched(self, f: _Fn, prompts, responses, gts, extras, completion_ids,
                     trajectories=None) -> list[tuple[str, Any]]:
        n = len(prompts)
        timeout = self._batched_timeout(n)
        args, kwargs = batch_call(f.call, prompts, responses, gts, extras, completion_ids, trajectories)
        if f.mode in ("async", "pool"):
            if f.mode == "async":
                status, values = self._event_loop().run([(f.fn, args, kwargs)], timeout)[0]
            else:
                status, values = self._pool.run([(f.ref, args, kwargs)], timeout_s=timeout)[0]
            if status != OK:
                values = f"batched call {values}" if status == TIMEOUT else values
                return _thread_hint([(status, values)], f.why_not_pooled if f.mode == "async" else None) * n
        else:
            try:
                values = _call_in_thread(f.fn, args, kwargs, timeout)
            except _Overrun:
                return [(TIMEOUT, f"batched call timed out after {timeout:g}s")] * n
            except Exception as exc:  # noqa: BLE001
                return _thread_hint([_error(exc)], f.why_not_pooled) * n
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            return [(ERROR, f"batched reward returned {got}, expected a list of {n}")] * n
        return [(OK, v) for v in values]

    def _event_loop(self) -> _EventLoop:
        if self._loop is None:
            self._loop = _EventLoop()
        return self._loop

    def score(self, prompts, responses, ground_truths, extras=None, completion_ids=None,
              trajectories=None) -> FunctionScores:
        """prompts, responses: texts (B,); ground_truths (B,); extras: one dict a sample (the
        dataset's other columns); completion_ids: the responses' token ids (TRL-style functions);
        trajectories: the agent loop's episodes (B,), passed to functions that name `trajectory`
        (`trajectories` when batched). With trajectories a function may return one number per
        turn: its sum is the score, and `turn_scores` holds the weighted per-turn values."""
        n = len(prompts)
        if not (len(responses) == len(ground_truths) == n):
            raise ValueError(f"lengths differ: {n} prompts, {len(responses)} responses, {len(ground_truths)} ground truths")
        extras = [dict(e or {}) for e in extras] if extras is not None else [{} for _ in range(n)]
        out = FunctionScores([0.0] * n, {"reward/errors": 0.0, "reward/timeouts": 0.0},
                             turn_scores=[None] * n if trajectories is not None else None,
                             reported_correct=[None] * n)
        scored = [False] * n
        sums: dict[str, list[float]] = {}
        for f in self.fns:
            if f.call.batched:
                results = self._run_batched(f, prompts, responses, ground_truths, extras, completion_ids, trajectories)
            else:
                results = self._run_per_sample(f, prompts, responses, ground_truths, extras, trajectories)
            scores = self._read_results(f, results, trajectories, out, sums)
            out.per_function[f.name] = scores
            applicable = [s for s in scores if not math.isnan(s)]
            if applicable or not n:
                out.metrics[f"reward/{f.name}/mean"] = sum(applicable) / len(applicable) if applicable else 0.0
                if len(applicable) != n:
                    out.weights[f"reward/{f.name}/mean"] = len(applicable)
            out.scores = [t if math.isnan(s) else t + f.weight * s for t, s in zip(out.scores, scores)]
            scored = [done or not math.isnan(s) for done, s in zip(scored, scores)]
        if any(f.call.style == "trl" for f in self.fns):
            out.metrics["reward/unscored"] = (n - sum(scored)) / n if n else 0.0
        out.metrics.update({k: sum(v) / len(v) for k, v in sums.items()})
        out.weights.update({k: len(v) for k, v in sums.items() if len(v) != n})
        return out

    def _read_results(self, f: _Fn, results: list[tuple[str, Any]], trajectories, out: FunctionScores,
                      sums: dict[str, list[float]]) -> list[float]:
        """f's (B,) scores from its calls' (status, value): failures scored default_score and
        counted in out.metrics, per-turn lists and reported correctness recorded in `out`, extra
        dict keys collected in `sums`. RewardError past max_error_rate."""
        n = len(results)
        scores, failures, first = [], 0, None
        skipped = sum(status == SKIPPED for status, _ in results)
        for i, (status, value) in enumerate(results):
            if status == SKIPPED:  # not called: the batch had already failed (RewardError below)
                scores.append(self.default_score)
                continue
            s = math.nan  # None (or nan, as TRL reads None) from a TRL-style function: not applicable
            if status == OK and trajectories is not None and isinstance(value, (list, tuple)):
                try:
                    value = self._turn_list(out.turn_scores, i, value, trajectories[i], f.weight)
                except (TypeError, ValueError) as exc:
                    status, value = _error(exc)
            if status == OK and not (f.call.style == "trl" and _not_applicable(value)):
                try:
                    s, ex = _normalize(value)
                    for k, v in ex.items():
                        sums.setdefault(f"reward/{f.name}/{k}", []).append(v)
                    if ACC_KEY in ex:
                        out.reported_correct[i] = bool(ex[ACC_KEY]) and out.reported_correct[i] is not False
                except (TypeError, ValueError) as exc:
                    status, value = _error(exc)
            if status != OK:
                s, failures, first = self.default_score, failures + 1, first or value
                out.metrics["reward/timeouts" if status == TIMEOUT else "reward/errors"] += 1
            scores.append(s)
        timeouts = sum(status == TIMEOUT for status, _ in results)
        if timeouts:
            print(f"[reinforge] reward '{f.name}': {timeouts}/{n} calls timed out and scored "
                  f"{self.default_score:g}: {next(v for st, v in results if st == TIMEOUT)}", file=sys.stderr)
        if hopeless(failures, n, self.max_error_rate):
            unscored = f", {skipped} more not scored once that many had failed" if skipped else ""
            raise RewardError(
                f"reward function '{f.name}' failed on {failures}/{n} samples{unscored} "
                f"(max_error_rate={self.max_error_rate}); first failure: {first}"
            )
        return scores

    @staticmethod
    def _turn_list(turn_scores: list, i: int, value, trajectory: dict, weight: float) -> float:
        """A per-turn reward list of sample i: checked against its turns, its weighted values
        added to turn_scores[i]; -> the sum, the sample's score."""
        turns = trajectory["turns"]
        if len(value) != turns:
            raise ValueError(f"per-turn reward has {len(value)} values for an episode of {turns} turns")
        vals = [_normalize(v)[0] for v in value]
        prev = turn_scores[i] or [0.0] * turns
        turn_scores[i] = [p + weight * v for p, v in zip(prev, vals)]
        return sum(vals)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def __enter__(self) -> "RewardManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
