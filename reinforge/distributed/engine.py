"""Generation inside a Ray rank (trainer.backend=ray): each rank generates its share of the
prompts with its own engine, next to its FSDP2 shards of the actor. See docs/distributed.md.

- lean / hf (CPU, or GPU without vLLM): an unsharded, frozen copy of the actor in the rank
  (`dense`), refilled from the shards one tensor at a time after each update (weights.copy_full).
  The copy costs one model of memory per rank; generating on the sharded module instead would
  all-gather every layer at every decoding step, and EOS stops rows at different steps on
  different ranks, so the ranks' collectives would not line up.
- an own_weights backend (vllm, GPU): an in-process engine per rank built with `rank_engine_kw`
  (vLLM's external launcher: the rank's process group is the engine's), asleep while the rank
  trains (weights offloaded to CPU, KV cache freed: sleep level 1), woken for generation in
  two steps: its weights (torch's cache emptied first), the new weights streamed in from the
  shards (weights.hf_tensors, LoRA merged out of place), then its KV cache.

Sampling is seeded per prompt: with a call seed s from the driver, prompt uid u draws from a
generator seeded with prompt_seed(s, u), so its samples do not depend on which rank draws them
or on what else is in the batch (lean/hf generate prompt by prompt for it; an engine with
`per_prompt_seeds`, vLLM, takes a seed per request). Greedy decoding needs no seed. The engine's
capabilities (workers/rollout/base.py) say which of these paths applies. The gateway
(rollout.agent) does not seed by prompt: its share runs in one call seeded once, its agents
against a gateway on the rank's own loopback.
"""
from __future__ import annotations

import os

import torch

from reinforge.distributed import weights
from reinforge.protocol import Batch

MASK63 = (1 << 63) - 1


def prompt_seed(seed: int, uid: int) -> int:
    """A 63-bit seed for prompt `uid` under call seed `seed` (splitmix64's finaliser: nearby
    uids get unrelated streams)."""
    z = (seed + (uid + 1) * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & MASK63


def rank_engine_kw(rank: int, world: int) -> dict:
    """build_rollout's engine arguments for an own_weights engine (vLLM) in Ray rank `rank` of
    `world`: it joins the rank's process group (the external launcher, whose environment is set
    here), starts asleep and takes its weights from the FSDP2 shards, one tensor at a time."""
    os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world))
    return dict(weight_items=weights.hf_tensors, enable_sleep_mode=True, distributed_executor_backend="external_launcher")


class RankEngine:
    """One rank's rollout (`rollout`) and the weights version it holds. `dense`: the unsharded
    copy the lean/hf rollout generates with, or None for an own_weights engine (vLLM)."""

    def __init__(self, rollout, dense=None):
        self.rollout, self.dense, self.version = rollout, dense, None

    def sync(self, sharded, version: int) -> None:
        """Collective (every rank, same version): bring the engine's weights to `sharded`'s."""
        if version == self.version:
            return
        if self.dense is not None:
            weights.copy_full(sharded, self.dense)
            self.rollout.sync_weights(self.dense)  # lean / hf: a no-op; wrappers forward it (as in a local run)
        else:
            self.rollout.sync_weights(sharded)  # its weight_items stream the shards' full tensors
        self.version = version

    def generate(self, sharded, version: int, prompts: Batch | None, kwargs: dict, seed: int | None) -> Batch | None:
        """Collective for the weight sync only: every rank is called, `prompts` None on a rank
        with no share. kwargs: n, temperature, greedy (Rollout.generate's)."""
        caps = self.rollout.capabilities
        if caps.sleeps:  # weights first: the KV cache is allocated once the new weights are in
            self.rollout.wake_up(["weights"])
        try:
            self.sync(sharded, version)
            if caps.sleeps:
                self.rollout.wake_up(["kv_cache"])
            if prompts is None:
                return None
            if seed is None or kwargs.get("greedy"):
                return self.rollout.generate(prompts, **kwargs)
            seeds = [prompt_seed(seed, int(u)) for u in prompts["uid"]]
            if not caps.seed_by_prompt:  # the whole share at once, seeded by its first prompt
                with torch.random.fork_rng():
                    torch.manual_seed(seeds[0])
                    return self.rollout.generate(prompts, **kwargs)
            if caps.per_prompt_seeds:
                return self.rollout.generate(prompts, seeds=seeds, **kwargs)
            parts = []
            with torch.random.fork_rng():
                for i, s in enumerate(seeds):
                    torch.manual_seed(s)
                    parts.append(self.rollout.generate(prompts.index([i]), **kwargs))
            return Batch.concat(parts)
        finally:
            if caps.sleeps:
                self.rollout.sleep()


def merge_shares(outs: list[Batch], prompts_per_share: list[int], n: int) -> Batch:
    """The ranks' outputs (one per share, in prompt order) -> one Batch. A share of m prompts
    returns m * n rows, then any extra rows (the gateway's split sequences, gateway/rollout.py):
    every share's first m * n rows come first, in prompt order, then the extras, as one engine
    would return them. Negative group ids (the gateway's dropped runs, each a group of its own)
    are numbered per rank, so they are renumbered -1, -2, ... over the whole batch."""
    heads = [o.index(range(m * n)) for o, m in zip(outs, prompts_per_share)]
    tails = [o.index(range(m * n, len(o))) for o, m in zip(outs, prompts_per_share) if len(o) > m * n]
    out = Batch.concat(heads + tails)
    if "group_ids" in out.tensors:
        gid = out["group_ids"].clone()
        void = gid < 0
        gid[void] = -torch.arange(1, int(void.sum()) + 1, dtype=gid.dtype)
        out["group_ids"] = gid
    return out

