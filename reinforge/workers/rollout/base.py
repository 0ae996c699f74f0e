"""The rollout interface: what the trainer, validation, the agent loop, the asynchronous
producer and a Ray rank may call on a generation engine, and what it says it can do.

Callers read `capabilities` instead of probing an engine's attributes or its class: the agent
loop needs `continues`, the asynchronous producer `async_ok`, a Ray rank `own_weights`,
`per_prompt_seeds` and `sleeps`. A wrapper (the agent loop's AgentRollout) reports its inner
engine's capabilities and forwards `model` / `generator` to it, so a caller never looks inside.

Shapes: B0 prompts, n samples each, B = B0 * n rows, b contexts, P prompt, T response.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:  # the registry (and config checks through it) import this module without torch
    import torch

    from reinforge.protocol import Batch


LEAN_MODEL_TYPES = ("qwen2", "qwen3", "llama", "qwen2_vl", "qwen2_5_vl", "qwen3_moe", "qwen2_moe", "mixtral")
"""The model types whose decoder layers the lean loop drives (lean.py; a VLM's language model; the
MoE ones record their routing for replay, models/moe.py)."""


def lean_drives(config: dict) -> bool:
    """Whether the lean loop drives a model of this config.json (as a dict, read without torch):
    one of LEAN_MODEL_TYPES with full attention in every layer (not Gemma's sliding windows)."""
    text = config.get("text_config") or config
    return (config.get("model_type") in LEAN_MODEL_TYPES
            and set(text.get("layer_types") or ["full_attention"]) == {"full_attention"})


@dataclass(frozen=True)
class RolloutCapabilities:
    continues: bool = True
    """continue_ids: continues token prefixes of any length (the agent loop's turns)."""
    records_log_probs: bool = True
    """The Batch holds `rollout_log_probs` (B, T): the behaviour log-probs truncated IS reads."""
    async_ok: bool = False
    """Runs in the asynchronous producer (rollout.staleness > 0): an in-process engine whose
    `with_model` copy samples from its own `generator`, never torch's global one."""
    needs_gpu: bool = False
    """Runs on a CUDA device only (checked before any model loads)."""
    own_weights: bool = False
    """Holds its own copy of the weights (loaded from the model folder, refreshed by sync_weights);
    False: generates with the module it was given, so sync_weights is a no-op."""
    per_prompt_seeds: bool = False
    """generate(..., seeds=[one per prompt]) draws each prompt's samples from its own seed."""
    seed_by_prompt: bool = True
    """A Ray rank without per_prompt_seeds may generate its share prompt by prompt, each under its
    own seed. False: one call for the whole share, seeded once (the gateway: its agents run
    concurrently and their calls batch by timing, so one prompt's samples depend on the others
    anyway, and prompt-by-prompt calls would run only n agents at a time)."""
    sleeps: bool = False
    """sleep() / wake_up(tags) free and restore its GPU memory between generations (a Ray rank's
    vLLM): wake_up(["weights"]) before a weight sync, wake_up(["kv_cache"]) after it."""


class Rollout(Protocol):
    """A generation engine. Built by `reinforge.workers.rollout.build_rollout` from its registry
    entry; every backend returns the same Batch (rollout/common.assemble_rollout)."""

    capabilities: RolloutCapabilities
    """What this engine can do (above); an instance may report less than its backend's entry
    (the lean loop falling back to generate() on an architecture it cannot drive)."""
    model: Any
    """The module generation runs on (own_weights: the module its weights are synced from)."""
    generator: torch.Generator | None
    """Sampling's random source: None is torch's global one (async_ok engines only use another)."""
    P: int
    """Prompt length the Batch is left-padded to (data.max_prompt_length)."""
    T: int
    """Response length the Batch is right-padded to (rollout.max_response_length)."""

    def generate(self, prompts: Batch, *, n: int, temperature: float = 1.0, greedy: bool = False) -> Batch:
        """prompts: non-tensor `prompt_ids` (token lists) and `uid` (B0,) plus per-prompt fields ->
        B rows: prompts (B, P), responses (B, T), input_ids / attention_mask (B, P+T),
        response_mask (B, T), group_ids (B,), truncated (B,), rollout_log_probs (B, T) when
        `records_log_probs`; meta: the sampling distribution (temperature, top_k, top_p).
        prompts.meta["policy_version"], when the caller knows it, is the version of the weights
        generating (the trainer's completed steps); rollout.agent stamps its calls with it."""
        ...

    def continue_ids(self, contexts: list[list[int]], max_new: int, *, greedy: bool,
                     sampling: tuple[float, int, float],
                     stop: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """b token lists (any lengths) continued by up to `max_new` tokens each, one sample a row,
        under `sampling` = (temperature, top_k, top_p) -> ids (b, max_new) padded after EOS and
        their log-probs (b, max_new). `stop(rows (k,), ids so far (b, t)) -> (k,) bool` may end
        rows early; an engine that does not call it leaves the cut to the caller."""
        ...

    def sync_weights(self, actor_model) -> None:
        """Bring the engine's weights to `actor_model`'s (a no-op without own_weights)."""
        ...

    def with_model(self, model) -> "Rollout":
        """The same rollout generating with `model` (the asynchronous producer's deep copy of the
        actor: its behaviour policy). Engines without `async_ok` may raise NotImplementedError."""
        ...


class WrappingRollout:
    """The part of a Rollout that a wrapper around another one (the agent loop, the gateway) takes
    from its inner engine: P, T, `model`, `generator`, `continue_ids`, the weight sync and sleep /
    wake_up. A subclass sets `self.inner` (and P, T through `wrap`) and adds generate /
    with_model / its capabilities."""

    inner: Rollout

    def wrap(self, inner: Rollout) -> None:
        self.inner, self.P, self.T = inner, inner.P, inner.T

    @property
    def model(self):
        return self.inner.model

    @property
    def generator(self):
        return self.inner.generator

    @generator.setter
    def generator(self, value) -> None:
        self.inner.generator = value

    def sync_weights(self, actor_model) -> None:
        self.inner.sync_weights(actor_model)

    def continue_ids(self, contexts: list[list[int]], max_new: int, **kw):
        return self.inner.continue_ids(contexts, max_new, **kw)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """The inner engine's (capabilities.sleeps: a Ray rank's vLLM on a GPU)."""
        self.inner.wake_up(tags)

    def sleep(self) -> None:
        self.inner.sleep()
