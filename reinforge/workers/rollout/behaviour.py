"""The behaviour policy: what generates the asynchronous producer's chunks
(trainers/async_rollout.py, rollout.staleness > 0), behind one small interface so that the
producer does not care where generation runs: `LocalBehaviour` is a frozen deep copy of the
actor in the trainer's process (the producer thread drives it); a Ray implementation
(reinforge.distributed) can drive rollout-worker actors instead.

    policy.load(version, weights)          # the trainer's weights after `version` completed steps
    batch = policy.generate(prompts, n=n, temperature=t, seed=s, refresh=None)

What `generate` must record, for B = B0 x n rows (B0 prompts, n samples each, interleaved as
rollout/common.assemble_rollout builds them) and T = rollout.max_response_length:
- the rollout Batch (prompts, responses, input_ids, attention_mask, response_mask, group_ids,
  truncated, per-prompt fields) of the wrapped Rollout (workers/rollout/base.py);
- `rollout_log_probs` (B, T) float32: each sampled token's log-prob under the sampling
  distribution of the weights that sampled it (truncated IS, algos/tis.py, reads it);
- `token_versions` (B, T) int64: the version of the weights that sampled each token (all
  positions: beyond response_mask it repeats the row's last version, and nothing reads it);
- `policy_version` (B,) int64: the oldest version among the row's tokens (its first token's),
  which the staleness bound and rollout/staleness_* (per row) count.

Sampling randomness: `seed=None` draws from the policy's own stream (seeded once at
construction, the timing schedule); an int draws the chunk from a fresh torch.Generator seeded
with it (the deterministic schedule: the seed is a function of the chunk, async_schedule.py),
so a remote implementation only ever needs an int, never a generator object.

Partial rollouts (rollout.partial): `refresh(t) -> version | None` is called by the engine
before it samples response position t >= 1; when it returns a version, that version's weights
have been loaded (by the callback, through `load`) and the engine continues the rows still
decoding with them, recomputing their KV cache under the new weights so that every later
token's recorded log-prob is exactly the new version's. An implementation that cannot swap
weights mid-generation sets `partial_ok = False` (the producer then refuses rollout.partial).
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

if TYPE_CHECKING:
    import torch

    from reinforge.protocol import Batch

Refresh = Callable[[int], "int | None"]
"""refresh(t): called before sampling response position t (>= 1) -> the version now loaded, or
None when the weights did not change. The producer's also carries `refresh.at`: the only
position where it can return a version (the deterministic schedule's switch), or None (any
position, once a newer version has been published), so that a remote engine, which cannot call
it at every token, knows when asking is worth a round trip (distributed/partial.py)."""


class BehaviourPolicy(Protocol):
    """What the asynchronous producer drives. Used from one thread at a time (the producer's)."""

    version: int
    """The version of the weights currently loaded (-1 before the first load)."""
    partial_ok: bool
    """generate() honours `refresh` (rollout.partial)."""

    def load(self, version: int, weights: Mapping[str, torch.Tensor] | None) -> None:
        """Use the trainer's weights after `version` completed steps from now on. `weights`:
        {parameter name: tensor} of the actor's trainable parameters (LoRA: the adapters only),
        a snapshot nobody writes to; None keeps the weights loaded (the version is only renamed:
        the producer's start, whose copy already holds the actor's weights)."""
        ...

    def generate(self, prompts: Batch, *, n: int, temperature: float, seed: int | None = None,
                 refresh: Refresh | None = None) -> Batch:
        """prompts (B0 prompts: prompt_ids, uid, per-prompt fields) -> the B = B0 x n rows above,
        with rollout_log_probs (B, T), token_versions (B, T) and policy_version (B,)."""
        ...


class LocalBehaviour:
    """A Rollout (lean: capabilities.async_ok) generating with its own frozen deep copy of the
    actor's module, in this process: the behaviour policy of the local producer."""

    def __init__(self, rollout, *, seed: int, copy_model: bool = True):
        """`rollout`: the trainer's rollout (an agent loop's wrapper included); its model is
        deep-copied unless `copy_model` is False (a test's own module). `seed` seeds the stream
        generate(seed=None) draws from."""
        import torch

        model = copy.deepcopy(rollout.model).requires_grad_(False) if copy_model else rollout.model
        self.rollout = rollout.with_model(model) if copy_model else rollout
        self.stream = torch.Generator().manual_seed(seed)
        self.version = -1
        self.partial_ok = bool(getattr(self.rollout, "supports_refresh", False))

    @property
    def model(self):
        return self.rollout.model

    def load(self, version: int, weights) -> None:
        if weights is not None:
            load_trainable(self.rollout.model, weights)
        self.version = version

    def generate(self, prompts, *, n: int, temperature: float, seed: int | None = None, refresh=None):
        import torch

        self.rollout.generator = self.stream if seed is None else torch.Generator().manual_seed(seed)
        # the weights' version in the prompts' meta (a shallow copy): rollout.agent stamps its calls with it
        prompts = type(prompts)(dict(prompts.tensors), dict(prompts.non_tensors),
                                {**prompts.meta, "policy_version": self.version})
        if refresh is None:
            batch = self.rollout.generate(prompts, n=n, temperature=temperature)
            if "token_versions" not in batch.tensors:  # rollout.agent's rows carry their calls' stamps
                T = batch["responses"].shape[1] if "responses" in batch.tensors else 0
                batch["token_versions"] = torch.full((len(batch), T), self.version, dtype=torch.long)
        else:
            if not self.partial_ok:
                raise NotImplementedError("this rollout cannot swap weights mid-generation (rollout.partial)")
            batch = self.rollout.generate(prompts, n=n, temperature=temperature, refresh=refresh,
                                          version=self.version)
        tv = batch["token_versions"]
        batch["policy_version"] = tv[:, 0].clone() if tv.shape[1] else torch.full((len(batch),), self.version,
                                                                                   dtype=torch.long)
        return batch


    def interrupt(self) -> None:
        """Cut short a generate() in progress on another thread, when the rollout copy can
        (rollout.agent: its agents' round ends now, and generate() raises)."""
        interrupt = getattr(self.rollout, "interrupt", None)
        if interrupt is not None:
            interrupt()

    def close(self) -> None:
        """Close the rollout copy when it holds a resource (rollout.agent: its model gateway)."""
        close = getattr(self.rollout, "close", None)
        if close is not None:
            close()


def load_trainable(model, snapshot) -> None:
    """Copy a snapshot {name: tensor} into `model`'s parameters of the same names (a VLM whose
    tower trains: its cached image features are dropped, models/vlm_forward.tower_weights_loaded)."""
    import torch

    from reinforge.models.vlm_forward import tower_weights_loaded

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in snapshot.items():
            params[name].copy_(value)
    tower_weights_loaded(model, snapshot.keys())
