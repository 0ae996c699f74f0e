"""Asynchronous, off-policy rollout (`rollout.staleness=k`, k > 0): a producer thread generates
the next steps' samples with a behaviour copy of the policy while the trainer updates.

    producer thread                                  trainer thread (RLTrainer.step)
    ---------------                                  -------------------------------
    load the newest published weights (version v)    take groups from the queue until the batch
    draw c prompts, generate c x n rows  ------->    is full (score them, dynamic sampling)
    tag every row policy_version = v                 old log-probs, advantages, update
    wait while k x B prompts are queued or in flight publish(actor): version v + 1

- The behaviour copy is a deep copy of the actor's module, touched only by the producer thread;
  `publish` clones the trainable parameters after each step (LoRA: the adapters only) and the
  producer loads the newest snapshot before each chunk, so no tensor is read while written.
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
- Sampling draws from the producer's own torch.Generator (seeded from trainer.seed and the step
  it starts at), so it never races the trainer's global RNG (validation's fork_rng restores that).
- Scoring stays on the trainer thread (the reward workers are not shared across threads).
- Resume: `resume_point` is where the first prompt not yet trained on came from (loader state
  before its round, offset in the round, uid); a checkpoint stores it, so no prompt is skipped or
  repeated. Samples generated but not trained at the save are generated again, from the
  checkpoint's weights: a resumed run is exact only for staleness 0.

Shapes: c prompts a chunk, n samples each, B = data.train_batch_size prompts a step.
"""
from __future__ import annotations

import copy
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from reinforge.protocol import Batch
from reinforge.rewards.result import RewardResult
from reinforge.trainers.stages import keep_informative_groups
from reinforge.trainers.validation import prompts_batch

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
    batch: Batch  # c x n rows, groups contiguous, with policy_version (c*n,)
    start: Start
    prompts: int
    gen_s: float  # the producer's generate() seconds
    taken: int = 0  # groups the trainer has taken


class AsyncProducer:
    """The producer thread and its bounded queue of generated chunks.

    `rollout`: a Rollout whose capabilities are `async_ok`, on a deep copy of the actor
    (`behaviour_rollout`); its `model` takes the published weights and its `generator` is the
    producer's. `loader`: the trainer's PromptLoader, from now on advanced by the producer only."""

    def __init__(self, rollout, loader, start: Start, *, version: int, n: int, temperature: float,
                 staleness: int, batch_prompts: int, chunk_prompts: int, seed: int):
        self.rollout, self.loader, self.n, self.temperature = rollout, loader, n, temperature
        self.capacity, self.chunk_prompts = staleness * batch_prompts, min(chunk_prompts, batch_prompts)
        self.cond = threading.Condition()
        self.queue: deque[Chunk] = deque()
        self.pending = 0  # prompts queued or being generated
        self.inflight: Start | None = None
        self.snapshot, self.version, self.loaded = None, version, version
        self.error: BaseException | None = None
        self.stopping = False
        # the round being split into chunks, and where the next chunk starts
        self.round, self.round_state, self.offset, self.next_uid = [], start.loader_state, start.offset, start.uid
        if start.offset:
            self.round = next(self.loader)
        rollout.generator = torch.Generator().manual_seed(seed)
        self.thread = threading.Thread(target=self._run, name="reinforge-async-rollout", daemon=True)
        self.thread.start()

    # ---- trainer side ------------------------------------------------------------------------
    def publish(self, model, version: int) -> None:
        """Hand the actor's trainable weights after `version` completed steps to the producer."""
        snap = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
        with self.cond:
            self.snapshot, self.version = snap, version
            self.cond.notify_all()

    def take(self, groups: int) -> tuple[Batch, float]:
        """Up to `groups` whole groups from the head of the queue (waiting for the first chunk) ->
        (rows, generate() seconds of the chunks finished by this take)."""
        with self.cond:
            while not self.queue and self.error is None and not self.stopping:
                self.cond.wait()
            if self.error is not None:
                raise RuntimeError("the asynchronous rollout producer failed") from self.error
            if not self.queue:
                raise RuntimeError("the asynchronous rollout producer was stopped")
            head = self.queue[0]
            k = min(groups, head.prompts - head.taken)
            rows = head.batch.index(range(head.taken * self.n, (head.taken + k) * self.n))
            head.taken += k
            self.pending -= k
            gen_s = 0.0
            if head.taken == head.prompts:
                self.queue.popleft()
                gen_s = head.gen_s
            self.cond.notify_all()
        return rows, gen_s

    def resume_point(self) -> Start:
        """Where the first prompt not yet taken came from (what a checkpoint stores)."""
        with self.cond:
            if self.queue:
                return self.queue[0].start.advanced(self.queue[0].taken)
            if self.inflight is not None:
                return self.inflight
            return self._next_start()

    def stop(self) -> None:
        """Stop after the chunk in progress. A chunk still running after STOP_TIMEOUT_S is left to
        the process's exit (a daemon thread) with a warning, rather than an error that would hide
        the exception the run may be unwinding from."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(STOP_TIMEOUT_S)
        if self.thread.is_alive():
            print(f"[reinforge] warning: the asynchronous rollout producer did not stop within {STOP_TIMEOUT_S:.0f} s",
                  file=sys.stderr)

    # ---- producer side -----------------------------------------------------------------------
    def _next_start(self) -> Start:
        if self.round and self.offset == len(self.round):  # the round is used up: the next one
            return Start(self.loader.state_dict(), 0, self.next_uid)
        return Start(self.round_state, self.offset, self.next_uid)

    def _draw(self) -> tuple[list[dict], Start]:
        """The next chunk's prompts (never crossing a round), under the lock."""
        if not self.round or self.offset == len(self.round):
            self.round_state, self.round, self.offset = self.loader.state_dict(), next(self.loader), 0
        start = Start(self.round_state, self.offset, self.next_uid)
        items = self.round[self.offset:self.offset + self.chunk_prompts]
        self.offset, self.next_uid = self.offset + len(items), self.next_uid + len(items)
        return items, start

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopping and self.pending + self.chunk_prompts > self.capacity:
                        self.cond.wait()
                    if self.stopping:
                        return
                    items, start = self._draw()
                    self.pending += len(items)
                    self.inflight = start
                    snap, version = self.snapshot, self.version
                if version != self.loaded:
                    load_trainable(self.rollout.model, snap)
                    self.loaded = version
                t0 = time.perf_counter()
                batch = self.rollout.generate(prompts_batch(items, start.uid), n=self.n, temperature=self.temperature)
                gen_s = time.perf_counter() - t0
                batch["policy_version"] = torch.full((len(batch),), version, dtype=torch.long)
                with self.cond:
                    self.queue.append(Chunk(batch, start, len(items), gen_s))
                    self.inflight = None
                    self.cond.notify_all()
        except BaseException as e:  # handed to the trainer at its next take()
            with self.cond:
                self.error = e
                self.cond.notify_all()


@torch.no_grad()
def load_trainable(model, snapshot: dict[str, torch.Tensor]) -> None:
    """Copy a `publish` snapshot into the behaviour copy's parameters of the same names."""
    params = dict(model.named_parameters())
    for name, value in snapshot.items():
        params[name].copy_(value)


def behaviour_rollout(rollout):
    """The trainer's rollout (an agent loop's wrapper included) generating with a frozen deep copy
    of its model: the behaviour policy."""
    return rollout.with_model(copy.deepcopy(rollout.model).requires_grad_(False))


def collect(producer: AsyncProducer, score, timer, *, want: int, n: int, dynamic: bool,
            max_rounds: int) -> tuple[Batch, dict[str, float], RewardResult]:
    """A step's batch from the producer's queue -> (scored batch, dynamic-sampling and timing
    metrics, the RewardResult of every row scored). `score(batch)` -> RewardResult
    (RewardWorker.score). Without dynamic sampling: `want` groups, scored at once. With it: each
    round takes the groups still missing and keeps the informative ones, until `want` are kept or
    max_rounds x want groups were seen (the synchronous loop's budget of prompts)."""
    parts, results, seen, kept, rounds, gen_s = [], [], 0, 0, 0, 0.0
    while kept < want and seen < max_rounds * want:
        with timer("gen"):  # the trainer's wait for generated groups
            rows, g = producer.take(min(want - kept, max_rounds * want - seen) if dynamic else want - kept)
        gen_s, got, rounds = gen_s + g, len(rows) // n, rounds + 1
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
    trained at this step (`version` completed steps), over the batch's sequences; and the truncated
    IS weights the actor applied (its rollout_corr/* metrics) under the rollout/ names."""
    lag = (version - batch["policy_version"]).float()
    out = {"rollout/staleness_mean": float(lag.mean()), "rollout/staleness_max": float(lag.max())}
    if "rollout_corr/tis_weight_mean" in actor_metrics:
        out["rollout/is_weight_mean"] = actor_metrics["rollout_corr/tis_weight_mean"]
        out["rollout/is_weight_clipped_frac"] = actor_metrics["rollout_corr/tis_clip_frac"]
    return out


def start_producer(trainer) -> AsyncProducer:
    """The producer of an RLTrainer (rollout.staleness > 0), from its current weights, loader
    position and uid (after resume: the checkpoint's `resume_point`)."""
    cfg, r = trainer.cfg, trainer.cfg.rollout
    if not trainer.rollout.capabilities.async_ok:  # lean on a model its loop cannot drive falls back to generate()
        from reinforge.config.load import ConfigError

        raise ConfigError(f"rollout.staleness={r.staleness} needs the lean decoding loop, which does not drive "
                          f"this model's architecture (Qwen2/Qwen3/Llama with full attention); set rollout.staleness=0")
    rollout = behaviour_rollout(trainer.rollout)
    start = Start(trainer.loader.state_dict(), trainer.resume_offset, trainer.next_uid)
    B = cfg.data.train_batch_size
    chunk = r.stream_prompts or max(1, r.micro_batch_size // r.n)
    # started inside the first step() after the loop counted it: step_idx - 1 steps are done
    return AsyncProducer(rollout, trainer.loader, start, version=trainer.step_idx - 1, n=r.n, temperature=r.temperature,
                         staleness=r.staleness, batch_prompts=B, chunk_prompts=chunk,
                         seed=cfg.trainer.seed * 1_000_003 + trainer.step_idx)
