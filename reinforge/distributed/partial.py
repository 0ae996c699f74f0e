"""Partial rollouts on Ray (rollout.partial=true, trainer.backend=ray): how a rollout worker,
busy inside one generate() call, learns that newer weights exist and gets them.

    trainer thread        producer thread (driver)              board (async actor)       rollout worker
    publish(v) -------->  ........................  published(v) ---------------->  newer(held) resolves
                                                                                    refresh(t): ask(key, t, held)
                          relay: next_request() <------------------------------ (blocks the worker)
                          refresh(t): the producer's own decision
                          (timing: newest; deterministic: v + 1 at
                          ceil(T/2), waiting for it) -> reply(key, (v, handle) | None) -->  fetch, verify, load;
                                                                                    recompute the KV cache

- The schedule's decision stays in one place, the producer's refresh closure
  (trainers/async_rollout.AsyncProducer._refresh), run on the driver exactly as in a local run;
  the board only carries questions and answers. So the deterministic schedule's exception (the
  trainer waiting on this chunk: finish with v) is decided by the same code.
- When a worker asks: the closure's `at` (behaviour.Refresh) is the only position where it can
  answer a version (deterministic), or None: any position, once a version newer than the one the
  worker holds has been published. The worker checks that without a round trip: it keeps one
  `newer(held)` call outstanding (across chunks, while it holds the same version) and polls it
  with ray.wait(timeout=0) before each token; the driver likewise keeps its `next_request()`
  call outstanding between chunks, so a chunk without a switch costs no round trip to the board.
- The answer is a publication's handle (transport.py); the worker fetches and verifies it
  (publication.py) like any load. A transfer that times out WEIGHT_SYNC_TRIES times: under the
  timing schedule the worker goes on with the weights it holds (its tokens are stamped with
  them), under the deterministic one the generation fails.
- Stop: the relay's closure raises Stopped; the board then answers the chunk's workers `ABORT`,
  which their refresh raises as GenerationAborted.
"""
from __future__ import annotations

import asyncio
import sys

ABORT = "abort"


class GenerationAborted(RuntimeError):
    """Raised inside a rollout worker's partial generation when the driver stopped the chunk."""


class PublicationBoard:
    """An async Ray actor (no CPU): the newest published version, and the questions of workers
    inside a partial generation with the driver's answers. `key`: (generation id, worker index)."""

    def __init__(self):
        self.newest = -1
        self.changed: asyncio.Event | None = None
        self.requests: asyncio.Queue | None = None
        self.replies: dict = {}
        self.aborted: set = set()

    def _init(self):
        if self.requests is None:  # created inside the actor's event loop
            self.changed, self.requests = asyncio.Event(), asyncio.Queue()

    async def published(self, version: int) -> None:
        self._init()
        if version > self.newest:
            self.newest = version
            self.changed.set()
            self.changed = asyncio.Event()

    async def newer(self, than: int) -> int:
        """Returns once a version newer than `than` is published -> that version."""
        self._init()
        while self.newest <= than:
            await self.changed.wait()
        return self.newest

    async def ask(self, key: tuple, t: int, held: int):
        """A worker's question before response position t -> the driver's reply."""
        self._init()
        if key[0] in self.aborted:
            return ABORT
        fut = asyncio.get_running_loop().create_future()
        self.replies[key] = fut
        await self.requests.put((key, t, held))
        return await fut

    async def next_request(self):
        """The next question -> (key, t, held)."""
        self._init()
        return await self.requests.get()

    async def reply(self, key: tuple, answer) -> None:
        self.replies.pop(key).set_result(answer)

    async def abort(self, gen: int) -> None:
        """Answer every question of generation `gen`, now and later, with ABORT."""
        self.aborted.add(gen)
        for key in [k for k in self.replies if k[0] == gen]:
            self.replies.pop(key).set_result(ABORT)


def worker_refresh(worker, board, key: tuple, at: int | None, tries: int, timeout_s: float):
    """The refresh(t) a rollout worker (rollout_workers.RolloutWorker) hands its lean loop for
    one partial generation: asks the driver through `board` when a version can be new (above),
    then fetches, verifies and loads the answered publication -> the version now held or None."""
    import ray

    from reinforge.distributed.transport import TransferTimeout

    policy = worker.policy
    start, state = policy.version, {"gave_up": False}

    def refresh(t: int) -> int | None:
        if at is not None:
            if t != at or policy.version > start:
                return None
        else:
            if state["gave_up"]:
                return None
            held, newer = worker.newer if worker.newer is not None else (None, None)
            if held != policy.version:  # one newer() call outstanding per version held, across chunks
                held, newer = policy.version, board.newer.remote(policy.version)
                worker.newer = (held, newer)
            if not ray.wait([newer], timeout=0)[0]:
                return None
            worker.newer = None
        answer = ray.get(board.ask.remote(key, t, policy.version))
        if answer is None:
            return None
        if answer == ABORT:
            raise GenerationAborted("the driver stopped this chunk")
        version, handle = answer
        for _ in range(tries):
            try:
                return worker.load(handle, timeout_s)
            except TransferTimeout as e:
                err = e
        if at is not None:  # deterministic: the switch must happen
            raise err
        print(f"[reinforge] warning: {err}; rollout worker {key[1]} continues with v{policy.version}",
              file=sys.stderr)
        state["gave_up"] = True
        return None

    return refresh
