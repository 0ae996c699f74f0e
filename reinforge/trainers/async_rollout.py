"""Asynchronous, off-policy rollout (`rollout.staleness=k`, k > 0): a producer thread generates
the next steps' samples with a behaviour copy of the policy while the trainer updates.

    producer thread                                  trainer thread (RLTrainer.step)
    ---------------                                  -------------------------------
    load the newest published weights (version v)    take groups from the queue until the batch
    draw c prompts, generate c x n rows  ------->    is full (score them, dynamic sampling)
    tag every row policy_version = v                 old log-probs, advantages, update
    wait while k x B prompts are queued or in flight publish(actor): version v + 1

- What generates is a BehaviourPolicy (workers/rollout/behaviour.py): `load(version, weights)`,
  `generate(prompts, n, temperature, seed, refresh)`. The local one (LocalBehaviour) is a deep
  copy of the actor's module, touched only by the producer thread; `publish` clones the
  trainable parameters after each step (LoRA: the adapters only) and the producer loads a
  snapshot before a chunk, outside its lock, so no tensor is read while written.
- rollout.schedule: `timing` loads the newest snapshot before each chunk; `deterministic`
  (async_schedule.py) loads version r - k for a chunk of round r, waiting for its publication,
  and seeds each chunk's sampling from (trainer.seed, the chunk's first uid).
- Bounded staleness: a chunk starts only while the prompts queued or in flight, itself included,
  number at most k x data.train_batch_size. Each step consumes at least B prompts (dynamic
  sampling consumes more), so a chunk generated at version v is trained on at step v + k at the
  latest: `policy_version` lags the weights being updated by at most k (rollout/staleness_max).
- Streaming: the producer generates chunks of whole groups (rollout.stream_prompts prompts) and
  the trainer takes groups as chunks finish, never more than it needs: dynamic sampling takes
  exactly the missing number of groups each round, so no informative group is thrown away.
- Off-policy correction: the batch carries the behaviour log-probs (`rollout_log_probs`, which
  the lean loop records), so the trainer computes the current policy's old log-probs and the
  actor, built with the run plan's tis_cap (set when staleness > 0), weights each token's loss by
  min(exp(old - behaviour), tis_cap): the vLLM backend's truncated importance sampling
  (algos/tis.py), reused.
- Sampling draws from the policy's own torch.Generator (timing: one stream seeded from
  trainer.seed and the step it starts at; deterministic: one per chunk), so it never races the
  trainer's global RNG (validation's fork_rng restores that).
- rollout.partial: the policy asks `refresh(t)` before each response position and continues
  with newer weights when there are (timing: any published; deterministic: v + 1 at one fixed
  position); every token records its version (token_versions, rollout/staleness_token_*).
- rollout.agent (reinforge.gateway): the behaviour copy is the GatewayRollout's twin over the
  copied engine (with_model: a second gateway), so the user's agents run in the producer thread;
  LocalBehaviour passes its version in the prompts' meta and every call is stamped with it (the
  weights change between chunks only); the rows' token_versions are those stamps and their
  rollout_log_probs the captured log-probs. A chunk's rows beyond c x n (rollout.agent_history
  =split's extra sequences, their prompt's uid as group id) are taken with their group
  (`rows_of`); stop() interrupts the chunk's agents instead of waiting for their deadline. On
  Ray (trainer.rollout_workers), each worker serves its share's agents (distributed/rollout_workers.py).
- Scoring stays on the trainer thread (the reward workers are not shared across threads).
- Resume, timing: `resume_point` is where the first prompt not yet trained on came from (loader
  state before its round, offset in the round, uid); a checkpoint stores it, so no prompt is
  skipped or repeated; samples generated but not trained at the save are generated again, from
  the checkpoint's weights (not exact). Deterministic: `state()` gives the rows generated but
  not trained (saved as CHUNKS_FILE) and where the next chunk starts, once every chunk of a
  version older than the checkpoint's is generated: the resumed run is bit-exact.

Shapes: c prompts a chunk, n samples each, B = data.train_batch_size prompts a step.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from reinforge.protocol import Batch
from reinforge.rewards.result import RewardResult
from reinforge.trainers.async_schedule import chunk_seed, chunk_version, partial_switch_position
from reinforge.trainers.stages import keep_informative_groups
from reinforge.trainers.validation import prompts_batch
from reinforge.workers.rollout.behaviour import BehaviourPolicy, LocalBehaviour

STOP_TIMEOUT_S = 60.0


@dataclass
class Start:
    """Where a prompt came from: the loader's state before its round, its offset in the round,
    and its uid (uids are consecutive within a round)."""
    loader_state: dict
    offset: int
    uid: int

    def advanced(self, k: int) -> "Start":
        return Start(self.loader_state, self.offset + k, self.uid + k)


@dataclass
class Chunk:
    batch: Batch  # c x n rows, groups contiguous, with policy_version (c*n,); then any extra rows
    # (rollout.agent_history=split: a run's other sequences, its prompt's uid as group id)
    start: Start
    prompts: int
    gen_s: float  # the producer's generate() seconds
    taken: int = 0  # groups the trainer has taken


CHUNKS_FILE = "async_rollout.pt"
"""The deterministic schedule's chunks generated but not yet trained on, in a checkpoint folder."""


def chunks_to_state(chunks: list[Chunk]) -> list[dict]:
    """Chunks as plain dicts of tensors and lists (what CHUNKS_FILE holds)."""
    return [{"tensors": dict(c.batch.tensors), "non_tensors": dict(c.batch.non_tensors), "meta": dict(c.batch.meta),
             "start": {"loader_state": c.start.loader_state, "offset": c.start.offset, "uid": c.start.uid},
             "prompts": c.prompts, "gen_s": c.gen_s} for c in chunks]


def chunks_from_state(state: list[dict]) -> list[Chunk]:
    return [Chunk(Batch(d["tensors"], d["non_tensors"], d["meta"]), Start(**d["start"]), d["prompts"], d["gen_s"])
            for d in state]


class Stopped(Exception):
    """Raised inside the producer thread (from a partial rollout's refresh) when stop() is called."""


class AsyncProducer:
    """The producer thread and its bounded queue of generated chunks.

    `policy`: the BehaviourPolicy that generates (workers/rollout/behaviour.py; LocalBehaviour:
    a deep copy of the actor), already holding the weights of `version`. `loader`: the trainer's
    PromptLoader, from now on advanced by the producer only. `schedule`: timing (the newest
    published weights, one sampling stream) or deterministic (async_schedule.py: the version
    and the seed of a chunk are functions of the chunk). `partial`: chunks switch to newer
    weights mid-generation (timing: whenever one is published; deterministic: at one fixed
    position, async_schedule.partial_switch_position of `response_length`). `saved`: the
    chunks a deterministic checkpoint stored (`state()`), queued before anything is generated."""

    def __init__(self, policy, loader, start: Start, *, version: int, n: int, temperature: float,
                 staleness: int, batch_prompts: int, chunk_prompts: int, seed: int,
                 schedule: str = "timing", partial: bool = False, response_length: int = 0,
                 saved: list[Chunk] | None = None):
        self.policy, self.loader, self.n, self.temperature = policy, loader, n, temperature
        self.staleness, self.batch_prompts, self.seed = staleness, batch_prompts, seed
        self.schedule, self.partial, self.response_length = schedule, partial, response_length
        self.capacity, self.chunk_prompts = staleness * batch_prompts, min(chunk_prompts, batch_prompts)
        self.cond = threading.Condition()
        self.queue: deque[Chunk] = deque(saved or ())
        self.pending = sum(c.prompts - c.taken for c in self.queue)  # prompts queued or being generated
        self.inflight: Start | None = None
        self.inflight_version = version
        self.base_version = version
        # published weights: timing keeps the newest only; deterministic every version a chunk
        # still to generate may need (>= the last one used); the policy holds `version` already
        self.snapshots: dict[int, dict | None] = {version: None}
        self.version = version
        self.waiting = False  # the trainer waits in take() on an empty queue
        self.error: BaseException | None = None
        self.stopping = False
        # the round being split into chunks, and where the next chunk starts
        self.round, self.round_state, self.offset, self.next_uid = [], start.loader_state, start.offset, start.uid
        if start.offset:
            self.round = next(self.loader)
        policy.load(version, None)
        self.thread = threading.Thread(target=self._run, name="reinforge-async-rollout", daemon=True)
        self.thread.start()

    @property
    def deterministic(self) -> bool:
        return self.schedule == "deterministic"

    # ---- trainer side ------------------------------------------------------------------------
    def publish(self, model, version: int) -> None:
        """Hand the actor's trainable weights after `version` completed steps to the producer."""
        remote = getattr(self.policy, "snapshot", None)  # a remote policy builds its own (Ray: on the ranks)
        snap = remote(model, version) if remote is not None else \
            {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
        with self.cond:
            if not self.deterministic:
                self.snapshots.clear()
            self.snapshots[version] = snap
            self.version = version
            self.cond.notify_all()

    def rows_of(self, chunk: Chunk, lo: int, hi: int) -> list[int]:
        """Row indices of a chunk's groups lo..hi-1: their n rows each, then the chunk's extra rows
        whose group ids are those groups' uids (rollout.agent_history=split's sequences)."""
        idx, B = list(range(lo * self.n, hi * self.n)), chunk.prompts * self.n
        if len(chunk.batch) > B:
            g = chunk.batch["group_ids"][B:]
            hit = (g >= chunk.start.uid + lo) & (g < chunk.start.uid + hi)
            idx += [B + j for j in hit.nonzero().flatten().tolist()]
        return idx

    def take(self, groups: int) -> tuple[Batch, float, int]:
        """Up to `groups` whole groups from the head of the queue (waiting for the first chunk) ->
        (their rows, generate() seconds of the chunks finished by this take, the groups taken)."""
        with self.cond:
            while not self.queue and self.error is None and not self.stopping:
                self.waiting = True
                self.cond.notify_all()  # the deterministic producer reads `waiting`
                self.cond.wait()
            self.waiting = False
            if self.error is not None:
                raise RuntimeError("the asynchronous rollout producer failed") from self.error
            if not self.queue:
                raise RuntimeError("the asynchronous rollout producer was stopped")
            head = self.queue[0]
            k = min(groups, head.prompts - head.taken)
            rows = head.batch.index(self.rows_of(head, head.taken, head.taken + k))
            head.taken += k
            self.pending -= k
            gen_s = 0.0
            if head.taken == head.prompts:
                self.queue.popleft()
                gen_s = head.gen_s
            self.cond.notify_all()
        return rows, gen_s, k

    def resume_point(self) -> Start:
        """Where the first prompt not yet taken came from (what a timing checkpoint stores)."""
        with self.cond:
            if self.queue:
                return self.queue[0].start.advanced(self.queue[0].taken)
            if self.inflight is not None:
                return self.inflight
            return self._next_start()

    def state(self) -> tuple[Start, list[Chunk]]:
        """The deterministic schedule's checkpoint: (where the first chunk not generated yet
        starts, the untaken rows of every chunk generated so far). Waits until every chunk whose
        version is older than the newest published one is generated, so that a resumed run,
        which has the newest weights only, never needs an older version: those rows are saved
        instead. A chunk in flight at the newest version is left to be generated again after a
        resume: from the same weights and seed, it comes out the same."""
        with self.cond:
            while self.error is None and not self.stopping and (
                    (self.inflight is not None and self.inflight_version < self.version)
                    or (self.inflight is None and self._version_of(self.next_uid) < self.version)):
                self.cond.wait()
            if self.error is not None:
                raise RuntimeError("the asynchronous rollout producer failed") from self.error
            chunks = [Chunk(c.batch.index(self.rows_of(c, c.taken, c.prompts)), c.start.advanced(c.taken),
                            c.prompts - c.taken, c.gen_s) for c in self.queue]
            return (self.inflight if self.inflight is not None else self._next_start()), chunks

    def stop(self) -> None:
        """Stop after the chunk in progress (a rollout.agent chunk is cut short: its agents are
        ended, LocalBehaviour.interrupt). A chunk still running after STOP_TIMEOUT_S is left to
        the process's exit (a daemon thread) with a warning, rather than an error that would hide
        the exception the run may be unwinding from."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        interrupt = getattr(self.policy, "interrupt", None)  # local or Ray (its rollout workers)
        if interrupt is not None:  # rollout.agent: hung agents need not hold the stop
            interrupt()
        self.thread.join(STOP_TIMEOUT_S)
        if self.thread.is_alive():
            print(f"[reinforge] warning: the asynchronous rollout producer did not stop within {STOP_TIMEOUT_S:.0f} s",
                  file=sys.stderr)
        elif isinstance(self.policy, LocalBehaviour):  # its copy's resources (rollout.agent: a gateway)
            self.policy.close()

    # ---- producer side -----------------------------------------------------------------------
    def _next_start(self) -> Start:
        if self.round and self.offset == len(self.round):  # the round is used up: the next one
            return Start(self.loader.state_dict(), 0, self.next_uid)
        return Start(self.round_state, self.offset, self.next_uid)

    def _version_of(self, first_uid: int) -> int:
        return chunk_version(first_uid, self.batch_prompts, self.staleness, self.base_version)

    def _draw(self) -> tuple[list[dict], Start]:
        """The next chunk's prompts (never crossing a round), under the lock."""
        if not self.round or self.offset == len(self.round):
            self.round_state, self.round, self.offset = self.loader.state_dict(), next(self.loader), 0
        start = Start(self.round_state, self.offset, self.next_uid)
        items = self.round[self.offset:self.offset + self.chunk_prompts]
        self.offset, self.next_uid = self.offset + len(items), self.next_uid + len(items)
        return items, start

    def _needed(self) -> bool:
        """The trainer waits for the chunk about to be generated (deterministic schedule)."""
        return self.waiting and not self.queue

    def _wait_for_version(self, target: int) -> int:
        """Under the lock: the deterministic version to use, `target` once published, or the
        newest when the trainer needs this chunk first (async_schedule.py); raises Stopped."""
        while not self.stopping and self.version < target and not self._needed():
            self.cond.wait()
        if self.stopping:
            raise Stopped()
        return target if self.version >= target else self.version

    def _take_snapshot(self, version: int, prune: bool = True):
        """Under the lock: the weights to load for `version` (None: the policy holds them), and
        the deterministic schedule forgets the snapshots older than a chunk's version (`prune`;
        no later chunk starts at an older one; a partial rollout's switch prunes nothing)."""
        snap = None if version == self.policy.version else self.snapshots[version]
        if self.deterministic and prune:
            for v in [v for v in self.snapshots if v < version]:
                del self.snapshots[v]
        return snap

    def _use(self, version: int, snap) -> None:
        """Outside the lock (a remote policy's transfer must not hold up the trainer)."""
        if version != self.policy.version:
            self.policy.load(version, snap)

    def _refresh(self, switch_at: int, version: int):
        """The partial rollout's refresh(t) for the chunk being generated at `version`
        (behaviour.Refresh). Deterministic: one switch, to version + 1 at position `switch_at`
        (each micro-batch of the chunk passes it; the first switch loads, the others find it)."""
        def refresh(t: int) -> int | None:
            with self.cond:
                if self.stopping:
                    raise Stopped()
                if self.deterministic:
                    if t != switch_at or self.policy.version > version:
                        return None
                    v = self._wait_for_version(version + 1)
                else:
                    v = self.version
                if v == self.policy.version:
                    return None
                snap = self._take_snapshot(v, prune=False)
            self._use(v, snap)
            return v
        refresh.at = switch_at if self.deterministic else None  # behaviour.Refresh: where it can switch
        return refresh

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    if self.deterministic:
                        version = self._wait_for_version(self._version_of(self.next_uid))
                    else:
                        while not self.stopping and self.pending + self.chunk_prompts > self.capacity:
                            self.cond.wait()
                        if self.stopping:
                            return
                        version = self.version
                    items, start = self._draw()
                    self.pending += len(items)
                    self.inflight, self.inflight_version = start, version
                    snap = self._take_snapshot(version)
                self._use(version, snap)
                seed = chunk_seed(self.seed, start.uid) if self.deterministic else None
                switch_at = partial_switch_position(self.response_length)
                refresh = self._refresh(switch_at, version) if self.partial else None
                t0 = time.perf_counter()
                batch = self.policy.generate(prompts_batch(items, start.uid), n=self.n, temperature=self.temperature,
                                             seed=seed, refresh=refresh)
                gen_s = time.perf_counter() - t0
                with self.cond:
                    self.queue.append(Chunk(batch, start, len(items), gen_s))
                    self.inflight = None
                    self.cond.notify_all()
        except Stopped:
            return
        except BaseException as e:  # handed to the trainer at its next take()
            with self.cond:
                if self.stopping:  # what stop() cut short (an interrupted rollout.agent round)
                    return
                self.error = e
                self.cond.notify_all()


def collect(producer: AsyncProducer, score, timer, *, want: int, dynamic: bool,
            max_rounds: int) -> tuple[Batch, dict[str, float], RewardResult]:
    """A step's batch from the producer's queue -> (scored batch, dynamic-sampling and timing
    metrics, the RewardResult of every row scored). `score(batch)` -> RewardResult
    (RewardWorker.score). Without dynamic sampling: `want` groups, scored at once. With it: each
    round takes the groups still missing and keeps the informative ones, until `want` are kept or
    max_rounds x want groups were seen (the synchronous loop's budget of prompts)."""
    parts, results, seen, kept, rounds, gen_s = [], [], 0, 0, 0, 0.0
    while kept < want and seen < max_rounds * want:
        with timer("gen"):  # the trainer's wait for generated groups
            rows, g, got = producer.take(min(want - kept, max_rounds * want - seen) if dynamic else want - kept)
        gen_s, rounds = gen_s + g, rounds + 1
        seen += got
        if not dynamic:
            parts.append(rows)
            kept += got
            continue
        with timer("reward"):
            results.append(score(rows))
        b, _, k = keep_informative_groups(rows | results[-1].batch())
        parts.append(b)
        kept += k
    batch = Batch.concat([b for b in parts if len(b)]) if kept else Batch()
    metrics = {"timing_s/gen_producer": gen_s}
    if dynamic:
        metrics.update({"dynamic_sampling/gen_rounds": rounds, "dynamic_sampling/kept_ratio": kept / max(seen, 1),
                        "dynamic_sampling/batch_fill": min(kept, want) / want})
        return batch, metrics, RewardResult.concat(results)
    with timer("reward"):
        reward = score(batch)
    return batch | reward.batch(), metrics, reward


def staleness_metrics(batch: Batch, version: int, actor_metrics: dict[str, float]) -> dict[str, float]:
    """rollout/staleness_{mean,max}: how many updates the behaviour policy lagged the weights
    trained at this step (`version` completed steps), over the batch's sequences (a row counts
    its oldest token's version); rollout/staleness_token_{mean,max}: the same over the response
    tokens (token_versions, which partial rollouts make differ within a row); and the truncated
    IS weights the actor applied (its rollout_corr/* metrics) under the rollout/ names."""
    lag = (version - batch["policy_version"]).float()
    out = {"rollout/staleness_mean": float(lag.mean()), "rollout/staleness_max": float(lag.max())}
    if "token_versions" in batch.tensors:
        m = batch["response_mask"].bool()
        tok = (version - batch["token_versions"][m]).float()
        if tok.numel():
            out.update({"rollout/staleness_token_mean": float(tok.mean()),
                        "rollout/staleness_token_max": float(tok.max())})
    if "rollout_corr/tis_weight_mean" in actor_metrics:
        out["rollout/is_weight_mean"] = actor_metrics["rollout_corr/tis_weight_mean"]
        out["rollout/is_weight_clipped_frac"] = actor_metrics["rollout_corr/tis_clip_frac"]
    return out


def start_producer(trainer, policy: BehaviourPolicy | None = None) -> AsyncProducer:
    """The producer of an RLTrainer (rollout.staleness > 0), from its current weights, loader
    position and uid (after resume: the checkpoint's `resume_point`, and under the deterministic
    schedule the chunks it saved, `trainer.resume_chunks`). `policy`: what generates (a
    BehaviourPolicy already holding the trainer's current weights); None builds LocalBehaviour,
    a deep copy of the trainer's rollout in this process."""
    from reinforge.config.load import ConfigError

    cfg, r = trainer.cfg, trainer.cfg.rollout
    if policy is None:
        if not trainer.rollout.capabilities.async_ok:  # lean on a model its loop cannot drive falls back to generate()
            raise ConfigError(f"rollout.staleness={r.staleness} needs the lean decoding loop, which does not drive "
                              f"this model's architecture (Qwen2/Qwen3/Llama with full attention); set rollout.staleness=0")
        # timing: one stream seeded from trainer.seed and the step the producer starts at
        policy = LocalBehaviour(trainer.rollout, seed=cfg.trainer.seed * 1_000_003 + trainer.step_idx)
    if r.partial and not policy.partial_ok:
        raise ConfigError("rollout.partial=true needs a behaviour policy that swaps weights mid-generation: the lean "
                          "backend's single-turn rollout with rollout.dtype=model (not the agent loop, "
                          "rollout.max_turns > 1, nor a bf16/fp16 decoding copy); set rollout.partial=false")
    start = Start(trainer.loader.state_dict(), trainer.resume_offset, trainer.next_uid)
    B = cfg.data.train_batch_size
    chunk = r.stream_prompts or max(1, r.micro_batch_size // r.n)
    # started inside the first step() after the loop counted it: step_idx - 1 steps are done
    producer = AsyncProducer(policy, trainer.loader, start, version=trainer.step_idx - 1, n=r.n,
                             temperature=r.temperature, staleness=r.staleness, batch_prompts=B, chunk_prompts=chunk,
                             seed=cfg.trainer.seed, schedule=r.schedule, partial=r.partial,
                             response_length=r.max_response_length, saved=trainer.resume_chunks)
    if r.partial:  # a switch moves the policy past the next chunk's version: keep the start's weights
        producer.publish(trainer.actor_model, trainer.step_idx - 1)
    return producer
