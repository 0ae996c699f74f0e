"""A small process pool whose calls each have a deadline; a stuck worker is killed and replaced.

concurrent.futures.ProcessPoolExecutor cannot time out one call: a hung worker keeps its slot
and the only cure is to tear the whole pool down. Here each worker gets one call at a time over
its own pipe, the parent knows when every call started, and a call past its deadline costs
exactly one SIGKILL and one fresh worker. Workers start with "forkserver" (never "fork": the
parent may hold CUDA state or threads that a forked child would inherit broken).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import signal
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any

OK, ERROR, TIMEOUT = "ok", "error", "timeout"
STARTUP_TIMEOUT_S = 120.0  # importing sympy & co. on a loaded 2-core machine can take a while


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


class TimeoutPool:
    """`run(tasks)` executes [(fn_ref, args, kwargs)] and returns [(status, value)] in order.

    status is "ok" (value = the return value), "error" (value = "Type: message") or
    "timeout" (the worker ran past timeout_s and was killed). fn_ref is a picklable callable
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
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self._preload = (list(preload_specs), list(preload_modules))
        self._workers: list[_Worker | None] = [None] * num_workers
        self.restarts = 0  # workers killed for running past their deadline or dying

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = None
        self.restarts += 1

    def _start_missing(self, wanted: int) -> None:
        """Start up to `wanted` absent workers together, then wait until all are ready."""
        fresh = []
        for i in range(self.num_workers):
            if self._workers[i] is None and len(fresh) < wanted:
                self._workers[i] = _Worker(self._ctx, *self._preload)
                fresh.append(i)
        for i in fresh:
            try:
                self._workers[i].wait_ready(STARTUP_TIMEOUT_S)
            except RuntimeError:
                self._replace(i)
                raise

    def _idle(self) -> list[int]:
        return [i for i, w in enumerate(self._workers) if w is not None and w.task is None]

    def run(self, tasks: list[tuple[Any, tuple, dict]]) -> list[tuple[str, Any]]:
        results: list[tuple[str, Any] | None] = [None] * len(tasks)
        pending = deque(range(len(tasks)))
        while pending or any(w is not None and w.task is not None for w in self._workers):
            if pending:
                self._start_missing(len(pending) - len(self._idle()))
            for i in self._idle():  # hand one task to every idle worker
                if not pending:
                    break
                t = pending.popleft()
                w = self._workers[i]
                try:
                    w.conn.send((t, *tasks[t]))
                    w.task = (t, time.monotonic())
                except (BrokenPipeError, OSError):  # died while idle: retry the task on a new worker
                    pending.appendleft(t)
                    self._replace(i)
            busy = [w for w in self._workers if w is not None and w.task is not None]
            if not busy:
                continue
            deadline = min(w.task[1] for w in busy) + self.timeout_s
            for conn in wait([w.conn for w in busy], timeout=max(0.0, deadline - time.monotonic())):
                i = next(j for j, w in enumerate(self._workers) if w is not None and w.conn is conn)
                w = self._workers[i]
                try:
                    task_id, status, value = conn.recv()
                    w.task = None
                    results[task_id] = (status, value)
                except (EOFError, OSError):  # the worker died (os._exit, segfault, OOM kill)
                    results[w.task[0]] = (ERROR, f"reward worker died (exit code {w.proc.exitcode})")
                    self._replace(i)
            now = time.monotonic()
            for i, w in enumerate(self._workers):
                if w is not None and w.task is not None and now - w.task[1] > self.timeout_s:
                    results[w.task[0]] = (TIMEOUT, f"timed out after {self.timeout_s:g}s")
                    self._replace(i)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        for i, w in enumerate(self._workers):
            if w is not None:
                try:
                    w.conn.send(None)
                    w.proc.join(timeout=1)
                except OSError:
                    pass
                w.kill()
                self._workers[i] = None
