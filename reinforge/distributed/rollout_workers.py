"""Rollout workers as their own Ray actors, apart from the FSDP2 trainer ranks
(trainer.backend=ray, rollout.staleness > 0, trainer.rollout_workers=M): the behaviour policy
of the asynchronous producer (workers/rollout/behaviour.py) when it runs disaggregated.

    trainer ranks (FSDP2)                 driver (producer thread)            rollout workers (M actors)
    update; rank 0 gathers the trainable  publish: keep the handle only  -->  fetch (timeout), verify the
    tensors one at a time (weights.py),                                        checksum, load; generate
    Publication.make, transport.send                                           a share of each chunk

- Each worker builds its own engine (`make_rollout(plan)`: lean / hf on an unsharded frozen
  model, on CPU here) and wraps it in a LocalBehaviour, so what a worker records per row
  (rollout_log_probs, token_versions, policy_version) is exactly the local producer's.
- The driver holds no weights: only the latest publication's handle (an object-store ref owned
  by trainer rank 0, which holds that one publication's tensors until the next replaces it).
- A transfer that does not finish within trainer.weight_sync_timeout_s is abandoned and
  retried (WEIGHT_SYNC_TRIES times). Under the timing schedule a worker that still has not got it
  keeps generating with its previous version while that stays within rollout.staleness of the
  wanted one (the rows are stamped with the version that really sampled them); beyond it, or under
  the deterministic schedule, the producer fails with the transfer error.
- A worker that dies (its process killed, out of memory) is started again, loads the latest
  publication and repeats the call it failed: training does not stop.
- A chunk of c prompts is split into M contiguous shares generated in parallel; with a chunk
  seed s, share i samples from prompt_seed(s, i) (engine.py), so a run with the same M and seed
  samples the same rows.
- Partial rollouts (rollout.partial): a worker inside a generation asks the driver for newer
  weights through a PublicationBoard actor (partial.py); the producer's own refresh closure
  answers, on the driver, with a publication's handle, so the schedule is decided as locally.
- rollout.agent (reinforge.gateway): each worker's engine is a GatewayRollout, so a worker serves
  its share's agents through a gateway on its own loopback; the shares merge as one engine would
  return them (engine.merge_shares: every share's rows first, then the split sequences), the
  dropped runs' negative group ids numbered over the whole run. The producer's stop() interrupts
  the workers' agents (the actors take that call while generating: two threads each).
"""
from __future__ import annotations

import os
import sys

import torch

from reinforge.distributed.engine import merge_shares, prompt_seed
from reinforge.distributed.publication import Publication
from reinforge.distributed.transport import ObjectStoreTransport, TransferTimeout
from reinforge.protocol import Batch

WEIGHT_SYNC_TRIES = 3


class RolloutWorker:
    """One rollout actor: its own engine, the version it holds, and the transfer in."""

    def __init__(self, plan, make_rollout, index: int, threads: int = 1):
        from reinforge.workers.rollout.behaviour import LocalBehaviour

        torch.set_num_threads(threads)
        rollout = make_rollout(plan)
        seed = plan.cfg.trainer.seed * 1_000_003 + 7919 * (index + 1)  # this worker's own stream (timing)
        self.policy = LocalBehaviour(rollout, seed=seed, copy_model=False)
        self.transport = ObjectStoreTransport()
        self.newer = None  # partial rollouts, timing: (version held, the board's newer() call)

    def pid(self) -> int:
        return os.getpid()

    def version(self) -> int:
        return self.policy.version

    def load(self, handle, timeout_s: float, rename_only: bool = False) -> int:
        """Fetch, verify and load a publication (CorruptPublication / TransferTimeout raise and
        leave the loaded weights as they were) -> the version now held."""
        pub = self.transport.fetch(handle, timeout_s).verify()
        self.policy.load(pub.version, pub.tensors)
        return pub.version

    def partial_ok(self) -> bool:
        return self.policy.partial_ok

    def interrupt(self) -> None:
        """End the agents of a generate() in progress (rollout.agent; else a no-op): it raises."""
        self.policy.interrupt()

    def generate(self, prompts: Batch, n: int, temperature: float, seed: int | None, partial=None):
        """-> the rows; with `partial` = (board, key, at, timeout_s), a partial generation
        (partial.worker_refresh) -> (the rows, the version held at its end)."""
        if partial is None:
            return self.policy.generate(prompts, n=n, temperature=temperature, seed=seed)
        from reinforge.distributed.partial import worker_refresh

        board, key, at, timeout_s = partial
        refresh = worker_refresh(self, board, key, at, WEIGHT_SYNC_TRIES, timeout_s)
        batch = self.policy.generate(prompts, n=n, temperature=temperature, seed=seed, refresh=refresh)
        return batch, self.policy.version


def publish_on_rank(model, version: int, rank: int):
    """Collective (every trainer rank): gather the trainable parameters one at a time; rank 0
    builds the Publication and puts it in the object store -> its handle on rank 0, else None."""
    from reinforge.distributed.weights import full_tensor

    tensors = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            t = full_tensor(p.detach())
            if rank == 0:
                tensors[name] = t.cpu().clone()
    if rank != 0:
        return None
    return ObjectStoreTransport().send(Publication.make(version, tensors))


class RayBehaviour:
    """The BehaviourPolicy (workers/rollout/behaviour.py) of a disaggregated Ray run: M rollout
    worker actors fed with publications from the trainer ranks (`group`, a RayWorkerGroup)."""

    worker_cpus: float | None = None
    """Ray CPUs each worker reserves (None: its torch threads); a small test cluster lowers it."""

    def __init__(self, group, plan, make_rollout, *, workers: int, timeout_s: float, staleness: int,
                 threads: int = 1, on_published=None):
        """`on_published()`: called on the trainer thread once a step's publication is built and
        before the producer has it (the crash campaign's kill point `ray:publish`)."""
        import ray

        self.group, self.plan, self.make_rollout, self.threads = group, plan, make_rollout, threads
        self.on_published = on_published
        self.timeout_s, self.staleness = timeout_s, staleness
        agents = bool(plan.cfg.rollout.agent)  # a second thread takes interrupt() during a generate()
        self.remote = ray.remote(RolloutWorker).options(
            num_cpus=threads if self.worker_cpus is None else self.worker_cpus, max_concurrency=2 if agents else 1)
        self.interrupted = False  # interrupt() was called (the producer's stop)
        self.void = 0  # rollout.agent: dropped runs so far, their rows' group ids -1, -2, ... over the run
        self.workers = [self._start(i) for i in range(workers)]
        self.version, self.latest, self.restarts, self.timeouts = -1, None, 0, 0
        self.schedule = plan.cfg.rollout.schedule
        self.published = None  # (version, handle) of the newest publication
        self.board, self.generating, self.gen_id = None, False, 0
        self.question = None  # the board's next_request() call, kept outstanding between chunks
        if plan.cfg.rollout.partial:
            from reinforge.distributed.partial import PublicationBoard

            self.board = ray.remote(PublicationBoard).options(num_cpus=0).remote()
        self._partial_ok = None

    @property
    def partial_ok(self) -> bool:
        """The workers' engine swaps weights mid-generation (rollout.partial): asked of worker 0."""
        import ray

        if self._partial_ok is None:
            self._partial_ok = bool(ray.get(self.workers[0].partial_ok.remote()))
        return self._partial_ok

    def _start(self, i: int):
        return self.remote.remote(self.plan, self.make_rollout, i, self.threads)

    # ---- trainer side (the trainer thread: calls the ranks) ----------------------------------
    def snapshot(self, model, version: int):
        """What AsyncProducer.publish stores for `version`: the handle of a publication built
        on the ranks from their shards (`model` is the driver's weightless skeleton, unused).
        A version already published (the producer's start, with partial rollouts) is reused."""
        if self.published is not None and self.published[0] == version:
            return {"__handle__": self.published[1]}
        handle = self.group.run_all("actor", "publish", version)[0]
        self.published = (version, handle)
        if self.on_published is not None and model is not None:  # a step's publication, not the start's
            self.on_published()
        if self.board is not None:
            self.board.published.remote(version)
        return {"__handle__": handle}

    # ---- producer side ----------------------------------------------------------------------
    def load(self, version: int, weights) -> None:
        """`weights`: a `snapshot`'s dict, or None at the producer's start, when the workers get
        the ranks' current weights (the start's, or a resumed checkpoint's) published now."""
        if weights is None:
            weights = self.snapshot(None, version)
        self.latest = weights["__handle__"]
        if self.generating:  # a partial generation's switch: the relay hands the handle to the asking worker
            self.version = version
            return
        for attempt in range(WEIGHT_SYNC_TRIES):
            try:
                self._call_all(lambda w: w.load.remote(self.latest, self.timeout_s), timeout=2 * self.timeout_s + 30)
                self.version = version
                return
            except TransferTimeout as e:
                self.timeouts += 1
                err = e
        if self.schedule == "timing" and self.version >= 0 and version - self.version < self.staleness:
            print(f"[reinforge] warning: {err}; generating with v{self.version} meanwhile", file=sys.stderr)
            return
        raise err

    def generate(self, prompts: Batch, *, n: int, temperature: float, seed: int | None = None, refresh=None) -> Batch:
        B0, M = len(prompts), len(self.workers)
        bounds = [(B0 * i // M, B0 * (i + 1) // M) for i in range(M)]
        shares = [(i, lo, hi) for i, (lo, hi) in enumerate(bounds) if hi > lo]

        def call(w, s, partial=None):
            return w.generate.remote(prompts.index(list(range(s[1], s[2]))), n, temperature,
                                     None if seed is None else (seed if len(shares) == 1 else prompt_seed(seed, s[0])),
                                     partial)
        from reinforge.workers.rollout.vlm import own_vision

        outs = self._call(shares, call) if refresh is None else self._generate_partial(shares, call, refresh)
        out = merge_shares(outs, [hi - lo for _, lo, hi in shares], n) if len(outs) > 1 else outs[0]
        if "group_ids" in out.tensors and bool((out["group_ids"] < 0).any()):  # rollout.agent's dropped runs
            gid = out["group_ids"].clone()
            void = gid < 0
            gid[void] = -self.void - torch.arange(1, int(void.sum()) + 1, dtype=gid.dtype)  # unique over the run
            self.void += int(void.sum())
            out["group_ids"] = gid
        return own_vision(prompts, out)  # image prompts: the driver's objects

    def _generate_partial(self, shares: list, call, refresh) -> list:
        """The shares of one partial generation, relaying the workers' questions (partial.py) to
        the producer's `refresh` on this (the producer's) thread -> the shares' rows. A worker
        that dies is restarted at the chunk's starting weights and its share generated again."""
        import ray

        if self.board is None:
            raise RuntimeError("rollout.partial needs the publication board (RayBehaviour built with rollout.partial)")
        self.gen_id += 1
        gen, start, at = self.gen_id, self.latest, getattr(refresh, "at", None)
        pending, out, held = {}, {}, {}

        def launch(s):
            pending[call(self.workers[s[0]], s, (self.board, (gen, s[0]), at, self.timeout_s))] = s
        for s in shares:
            launch(s)
        req = self.question if self.question is not None else self.board.next_request.remote()
        self.generating = True
        try:
            while pending:
                ready = ray.wait([req, *pending], num_returns=1)[0][0]
                if ready == req:
                    self._answer(ray.get(req), gen, refresh)
                    req = self.board.next_request.remote()
                    continue
                s = pending.pop(ready)
                try:
                    out[s], held[s] = ray.get(ready)
                except ray.exceptions.RayActorError:
                    self._restart(s[0], start)
                    launch(s)
                except ray.exceptions.RayTaskError as e:
                    raise e.as_instanceof_cause() from None
        except BaseException:
            self.board.abort.remote(gen)
            raise
        finally:
            # left outstanding for the next chunk (no round trip here); a question a killed
            # worker asked before dying reaches it then and is answered None (_answer)
            self.question, self.generating = req, False
        self.version = min(held.values())  # workers may differ (timing): the next load reaches all
        return [out[s] for s in shares]

    def _answer(self, question, gen: int, refresh) -> None:
        """Reply to a worker's question (key, t, version it holds): the producer's `refresh(t)`
        decides, and a worker not holding self.version gets its handle. A question of another
        generation (a worker killed while asking) gets None."""
        key, t, held = question
        if key[0] == gen:
            refresh(t)  # the producer's decision; a switch lands in load() as self.version, self.latest
        answer = None if key[0] != gen or self.version == held else (self.version, self.latest)
        self.board.reply.remote(key, answer)

    def interrupt(self) -> None:
        """The producer's stop(): end the agents of a chunk in progress on every worker now
        (rollout.agent; its generate() then raises), without waiting for the answer."""
        self.interrupted = True
        for w in self.workers:
            w.interrupt.remote()

    def pids(self) -> list[int]:
        import ray

        return ray.get([w.pid.remote() for w in self.workers])

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
        if self.board is not None:
            ray.kill(self.board, no_restart=True)
            self.board = None

    # ---- calls that survive a worker's death -------------------------------------------------
    def _call_all(self, fn, timeout: float | None = None) -> list:
        return self._call([(i,) for i in range(len(self.workers))], lambda w, s: fn(w), timeout)

    def _call(self, items: list, fn, timeout: float | None = None) -> list:
        """fn(worker, item) -> ref for each item (item[0]: the worker's index); a worker found
        dead is restarted, given the latest publication, and its item called again."""
        import ray

        out = {}
        todo = list(items)
        while todo:
            refs = {fn(self.workers[s[0]], s): s for s in todo}
            todo = []
            for ref, s in refs.items():
                try:
                    out[s] = ray.get(ref, timeout=timeout)
                except ray.exceptions.RayActorError:
                    self._restart(s[0])
                    todo.append(s)
                except ray.exceptions.GetTimeoutError:
                    raise TransferTimeout(f"rollout worker {s[0]} did not answer within {timeout:g} s") from None
                except ray.exceptions.RayTaskError as e:
                    if self.interrupted:  # the other workers' interrupted calls: read, not logged as unhandled
                        for other in refs:
                            if other is not ref and refs[other] not in out:
                                try:
                                    ray.get(other, timeout=10)
                                except Exception:  # noqa: BLE001 - each fails as this one did
                                    pass
                    raise e.as_instanceof_cause() from None
        return [out[s] for s in items]

    def _restart(self, i: int, handle=None) -> None:
        """Start worker i again and load `handle` (default: the latest publication)."""
        import ray

        self.restarts += 1
        print(f"[reinforge] rollout worker {i} died: restarting it (restart {self.restarts})", file=sys.stderr)
        ray.kill(self.workers[i], no_restart=True)
        self.workers[i] = self._start(i)
        handle = self.latest if handle is None else handle
        if handle is not None:
            ray.get(self.workers[i].load.remote(handle, self.timeout_s))
