"""A small process pool whose calls each have a deadline; a stuck worker is killed and replaced.

concurrent.futures.ProcessPoolExecutor cannot time out one call: a hung worker keeps its slot
and the only cure is to tear the whole pool down. Here each worker gets one call at a time over
its own pipe, the parent knows when every call started, and a call past its deadline costs
exactly one SIGKILL and one fresh worker. Workers start with "forkserver" (never "fork": the
parent may hold CUDA state or threads that a forked child would inherit broken). Calls run on a
worker's main thread, so libraries that time themselves with signal.alarm (math_verify) work.

A run's scheduling is `Schedule` (no processes, no clock, so tests drive it directly): after a
time-out the run may use up to BURST_WORKERS workers, and it stops, leaving the remaining calls
SKIPPED, once its failures exceed max_error_rate of its calls (the batch can no longer pass).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import signal
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any

OK, ERROR, TIMEOUT, SKIPPED = "ok", "error", "timeout", "skipped"
STARTUP_TIMEOUT_S = 120.0  # importing sympy & co. on a loaded 2-core machine can take a while
# Workers a run may use once one of its calls timed out, so that the deadlines of the calls
# left run side by side: a function that hangs on every call then fails its batch after about
# 1 + ceil(floor(max_error_rate * n) / BURST_WORKERS) deadlines instead of n (Schedule).
BURST_WORKERS = 16


def _worker_main(conn, preload_specs: list[str], preload_modules: list[str]) -> None:
    """Worker loop: preload, say ready, then receive (task_id, fn_ref, args, kwargs) and reply."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from reinforge.rewards.registry import load_reward_fn

    cache: dict[str, Any] = {}
    try:
        # Slow imports happen here, before the first call's clock starts, so a cold worker's
        # first call is not mistaken for a hang.
        for name in preload_modules:
            importlib.import_module(name)
        for spec in preload_specs:
            cache[spec] = load_reward_fn(spec)
            warm_up = getattr(cache[spec], "warm_up", None)  # e.g. math_verify's first parse (~0.4 s)
            if warm_up is not None:
                warm_up()
        conn.send(("ready", None))
    except BaseException as exc:  # noqa: BLE001
        conn.send(("ready", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task_id, fn_ref, args, kwargs = msg
        try:
            if isinstance(fn_ref, str) and fn_ref not in cache:
                cache[fn_ref] = load_reward_fn(fn_ref)
            fn = cache[fn_ref] if isinstance(fn_ref, str) else fn_ref
            reply = (task_id, OK, fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - any failure of user code is reported, not fatal
            reply = (task_id, ERROR, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable return value
            conn.send((task_id, ERROR, f"cannot send result back: {type(exc).__name__}: {exc}"))


class _Worker:
    def __init__(self, ctx, preload_specs: list[str], preload_modules: list[str]):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, preload_specs, preload_modules), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task: tuple[int, float] | None = None  # (task index, start time) while busy

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            raise RuntimeError(f"reward worker did not start within {timeout:g}s")
        _, error = self.conn.recv()
        if error is not None:
            raise RuntimeError(f"reward worker failed to start: {error}")
        self.ready = True

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


def hopeless(failures: int, n: int, max_error_rate: float | None) -> bool:
    """Whether `failures` of n calls already exceed max_error_rate (RewardManager's RewardError
    rule), so the calls left cannot save the batch. None: never."""
    return max_error_rate is not None and n > 0 and failures / n > max_error_rate


class Schedule:
    """One run of n calls, without processes or clocks: which call starts next, how many workers
    may run, and when to give up.

    - Calls start in order on free workers, at most `limit()` at once: num_workers, or
      max(num_workers, BURST_WORKERS) once a call of this run timed out (a hung function's other
      calls then time out side by side rather than one after another).
    - `stopped` once failures (errors and time-outs) exceed max_error_rate of n: no call starts
      any more, the running ones are to be abandoned, and `results()` marks every call without a
      result SKIPPED.
    With one worker, a function that hangs on every call and max_error_rate=0.5 stops after
    2 deadlines for n=16 (one, then the other 15 side by side), 9 for n=256, instead of n.
    """

    def __init__(self, n: int, num_workers: int, max_error_rate: float | None = None):
        self.n, self.num_workers, self.max_error_rate = n, num_workers, max_error_rate
        self.pending = deque(range(n))
        self._results: list[tuple[str, Any] | None] = [None] * n
        self.failures = 0
        self.timed_out = False

    def limit(self) -> int:
        """Workers that may be busy at once now."""
        return max(self.num_workers, BURST_WORKERS) if self.timed_out else self.num_workers

    @property
    def stopped(self) -> bool:
        return hopeless(self.failures, self.n, self.max_error_rate)

    def next_task(self) -> int | None:
        """The next call to start, None when none is left or the run stopped."""
        return self.pending.popleft() if self.pending and not self.stopped else None

    def retry(self, task: int) -> None:
        """A call that could not be handed over (its worker died idle) starts again first."""
        self.pending.appendleft(task)

    def finish(self, task: int, status: str, value: Any) -> None:
        self._results[task] = (status, value)
        if status != OK:
            self.failures += 1
            self.timed_out = self.timed_out or status == TIMEOUT

    def done(self, busy: int) -> bool:
        """Whether the run is over, with `busy` calls still running."""
        return self.stopped or (not self.pending and busy == 0)

    def results(self) -> list[tuple[str, Any]]:
        why = (f"not scored: {self.failures} of {self.n} calls had already failed "
               f"(more than max_error_rate={self.max_error_rate})")
        return [r if r is not None else (SKIPPED, why) for r in self._results]


class TimeoutPool:
    """`run(tasks)` executes [(fn_ref, args, kwargs)] and returns [(status, value)] in order.

    status is "ok" (value = the return value), "error" (value = "Type: message"), "timeout" (the
    worker ran past timeout_s and was killed) or "skipped" (not run: the run had already failed
    more than its max_error_rate allows; see Schedule). fn_ref is a picklable callable
    or a reward spec string that workers resolve (and cache) with load_reward_fn.
    `preload_specs` / `preload_modules` are resolved / imported by each worker at start-up; a
    resolved function's `warm_up` attribute, if any, is called then too.
    """

    def __init__(self, num_workers: int, timeout_s: float, *, preload_specs=(), preload_modules=(),
                 start_method: str = "forkserver"):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        methods = mp.get_all_start_methods()
        self._ctx = mp.get_context(start_method if start_method in methods else "spawn")
        if self._ctx.get_start_method() == "forkserver":
            # The fork server imports what every worker imports, once: 16 workers started in
            # 0.3-0.4 s instead of ~6 s on a loaded 2-core machine (the time-out burst starts up
            # to 16 at once). Ignored once the fork server runs; "__main__" is the default entry.
            self._ctx.set_forkserver_preload(["__main__", __name__, "reinforge.rewards.registry"])
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self._preload = (list(preload_specs), list(preload_modules))
        self._workers: list[_Worker | None] = [None] * num_workers
        self.restarts = 0  # workers killed for running past their deadline or dying

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = None
        self.restarts += 1

    def _start_missing(self, wanted: int, limit: int) -> None:
        """Start up to `wanted` absent workers together (slots up to `limit`), then wait until
        all are ready."""
        self._workers.extend([None] * (limit - len(self._workers)))
        fresh = []
        for i in range(limit):
            if self._workers[i] is None and len(fresh) < wanted:
                self._workers[i] = _Worker(self._ctx, *self._preload)
                fresh.append(i)
        for i in fresh:
            try:
                self._workers[i].wait_ready(STARTUP_TIMEOUT_S)
            except RuntimeError:
                self._replace(i)
                raise

    def _idle(self, limit: int) -> list[int]:
        return [i for i, w in enumerate(self._workers[:limit]) if w is not None and w.task is None]

    def _busy(self) -> list[int]:
        return [i for i, w in enumerate(self._workers) if w is not None and w.task is not None]

    def run(self, tasks: list[tuple[Any, tuple, dict]], *, timeout_s: float | None = None,
            max_error_rate: float | None = None) -> list[tuple[str, Any]]:
        """[(status, value)] of each task, in order. timeout_s: this run's deadline per call
        (default the pool's); max_error_rate: stop once more than this fraction of the tasks
        failed, the rest SKIPPED (Schedule)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        plan = Schedule(len(tasks), self.num_workers, max_error_rate)
        try:
            self._run(tasks, plan, timeout)
        finally:
            for i in self._busy():  # abandoned by a stopped run (or an exception): kill, no wait
                self._replace(i)
            for i in range(self.num_workers, len(self._workers)):  # burst workers go after the run
                if self._workers[i] is not None:
                    self._close_worker(i)
            del self._workers[self.num_workers:]
        return plan.results()

    def _run(self, tasks: list[tuple[Any, tuple, dict]], plan: Schedule, timeout: float) -> None:
        while not plan.done(len(self._busy())):
            limit = plan.limit()
            if plan.pending:
                self._start_missing(len(plan.pending) - len(self._idle(limit)), limit)
            for i in self._idle(limit):  # hand one task to every idle worker
                t = plan.next_task()
                if t is None:
                    break
                w = self._workers[i]
                try:
                    w.conn.send((t, *tasks[t]))
                    w.task = (t, time.monotonic())
                except (BrokenPipeError, OSError):  # died while idle: retry on a new worker
                    plan.retry(t)
                    self._replace(i)
                except Exception as exc:  # noqa: BLE001 - the arguments cannot be pickled
                    plan.finish(t, ERROR, f"cannot send the call to a reward worker: {type(exc).__name__}: {exc}")
            busy = [self._workers[i] for i in self._busy()]
            if not busy:
                continue
            deadline = min(w.task[1] for w in busy) + timeout
            for conn in wait([w.conn for w in busy], timeout=max(0.0, deadline - time.monotonic())):
                i = next(j for j, w in enumerate(self._workers) if w is not None and w.conn is conn)
                w = self._workers[i]
                try:
                    task_id, status, value = conn.recv()
                    w.task = None
                    plan.finish(task_id, status, value)
                except (EOFError, OSError):  # the worker died (os._exit, segfault, OOM kill)
                    plan.finish(w.task[0], ERROR, f"reward worker died (exit code {w.proc.exitcode})")
                    w.task = None
                    self._replace(i)
            now = time.monotonic()
            for i in self._busy():
                w = self._workers[i]
                if now - w.task[1] > timeout:
                    plan.finish(w.task[0], TIMEOUT, f"timed out after {timeout:g}s")
                    w.task = None
                    self._replace(i)

    def _close_worker(self, i: int) -> None:
        w = self._workers[i]
        try:
            w.conn.send(None)
            w.proc.join(timeout=1)
        except OSError:
            pass
        w.kill()
        self._workers[i] = None

    def close(self) -> None:
        for i, w in enumerate(self._workers):
            if w is not None:
                self._close_worker(i)
