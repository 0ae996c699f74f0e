"""Rollout with transformers' `generate` (KV cache), in the trainer's process.

Prompts are left-padded to P = data.max_prompt_length and responses right-padded to
T = rollout.max_response_length, so batches from several generation rounds concatenate.
The actor's module is used directly, so there are no weights to sync.

Sampling is exactly the configured one: generate() fills every field a GenerationConfig leaves
unset from `model.generation_config` (a model folder's generation_config.json: temperature,
top_k, top_p, repetition_penalty, ...) and then from transformers' defaults (top_k=50), so the
model's config is swapped for a blank one during the call and top_k=0 is passed explicitly.
`rollout_log_probs` (B, T) are the log-probs of the sampled tokens under the distribution
sampled from (temperature, top-k, top-p), recorded step by step (no (B, T, V) scores kept).
"""
from __future__ import annotations

import contextlib
import copy

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from reinforge.algos.logprobs import sampling_log_probs
from reinforge.models.forward import unwrap_peft
from reinforge.models.padding import pad
from reinforge.protocol import Batch
from reinforge.workers.rollout.base import RolloutCapabilities
from reinforge.workers.rollout.common import assemble_rollout, finish_masks, pad_prompts, sampling_meta, stop_token_ids
from reinforge.workers.rollout.vlm import chunk_vision, generate_kwargs


class SampledLogProbs(LogitsProcessor):
    """Records the log-prob of each sampled token under the distribution it was drawn from.

    generate() runs custom processors before its own warpers, so this one sees the raw scores
    and applies the warpers itself (temperature, then `sampling_filter_`: the same kept set as
    TopK/TopPLogitsWarper, tested); the token drawn at a step is read at the next call (or from
    the final sequences by `result`). Holds one (B, V) log-softmax at a time.
    """

    def __init__(self, temperature: float, top_k: int, top_p: float):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.last, self.steps = None, []

    def _take(self, tokens: torch.Tensor) -> None:
        self.steps.append(self.last.gather(-1, tokens[:, None]).squeeze(-1))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:
            self._take(input_ids[:, -1])
        self.last = sampling_log_probs(scores, self.temperature, self.top_k, self.top_p)
        return scores

    def result(self, sequences: torch.Tensor) -> torch.Tensor:
        """-> (B, steps) log-probs, given generate()'s output sequences."""
        self._take(sequences[:, -1])
        return torch.stack(self.steps, dim=1)


@contextlib.contextmanager
def blank_generation_config(model):
    """The model's generation_config replaced by a default one for the duration (looking through
    a PEFT wrapper, which copies the inner model's config at each generate call)."""
    inner = unwrap_peft(model)
    saved = inner.generation_config
    inner.generation_config = GenerationConfig()
    try:
        yield
    finally:
        inner.generation_config = saved


class HFRollout:
    """`generate(prompts)` -> a Batch of n samples per prompt, interleaved, with group ids."""

    # generate() samples from torch's global generator: the asynchronous producer needs the lean loop.
    capabilities = RolloutCapabilities()
    generator: torch.Generator | None = None

    def __init__(self, model, tokenizer, *, max_prompt_length: int, max_response_length: int,
                 micro_batch_size: int = 256, top_p: float = 1.0, top_k: int = 0, ignore_eos: bool = False):
        self.model, self.tok = model, tokenizer
        self.P, self.T = max_prompt_length, max_response_length
        self.micro_batch_size, self.top_p, self.top_k = micro_batch_size, top_p, top_k
        self.eos_ids, self.ignore_eos = stop_token_ids(tokenizer, model), ignore_eos

    @classmethod
    def from_config(cls, model, tokenizer, r, *, max_prompt_length: int):
        """The registry's build (workers/rollout/__init__.py): the rollout section `r` -> keywords."""
        return cls(model, tokenizer, max_prompt_length=max_prompt_length, max_response_length=r.max_response_length,
                   micro_batch_size=r.micro_batch_size, top_p=r.top_p, top_k=r.top_k, ignore_eos=r.ignore_eos)

    def with_model(self, model) -> "HFRollout":
        """This rollout generating with `model` (an architecture-identical copy of the actor)."""
        twin = copy.copy(self)
        twin.model = model
        return twin

    def _gen_config(self, n: int, temperature: float, greedy: bool, T: int) -> GenerationConfig:
        # Every sampling field explicit; with the model's config blanked, nothing else applies.
        kw = dict(max_new_tokens=T, num_return_sequences=n, pad_token_id=self.tok.pad_token_id,
                  eos_token_id=None if self.ignore_eos else self.eos_ids, use_cache=True)
        if greedy:
            return GenerationConfig(do_sample=False, **kw)
        return GenerationConfig(do_sample=True, temperature=temperature, top_p=self.top_p, top_k=self.top_k, **kw)

    @torch.no_grad()
    def _generate_ids(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, greedy: bool,
                      sampling: tuple[float, int, float], T: int | None = None,
                      stop=None, vision: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B0, P) -> responses (B0 * n, T) padded with pad_token_id, and their log-probs (B0 * n, T)
        (0 on padding) under `sampling` = (temperature, top_k, top_p). T defaults to
        max_response_length; `stop` (the lean loop's early exit, see continue_ids) is not used
        here: the caller cuts each row at its stop itself. vision: a VLM's B0 PromptImages
        (workers/rollout/vlm.py) or None."""
        T = T or self.T
        device = next(self.model.parameters()).device
        was_training = self.model.training
        record = SampledLogProbs(*sampling)
        self.model.eval()
        try:
            with blank_generation_config(self.model):
                out = self.model.generate(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device),
                                          generation_config=self._gen_config(n, sampling[0], greedy, T),
                                          logits_processor=LogitsProcessorList([record]),
                                          **generate_kwargs(self.model, prompt_ids.to(device), vision))
        finally:
            self.model.train(was_training)
        resp, logp = out[:, prompt_ids.shape[1]:].cpu(), record.result(out).float().cpu()
        if resp.shape[1] < T:
            pad = torch.full((resp.shape[0], T - resp.shape[1]), self.tok.pad_token_id, dtype=resp.dtype)
            resp, logp = torch.cat([resp, pad], dim=1), torch.cat([logp, torch.zeros(pad.shape)], dim=1)
        return resp, logp

    def sync_weights(self, actor_model) -> None:
        """Nothing to do: generation runs on the actor's own module."""

    def continue_ids(self, contexts: list[list[int]], max_new: int, *, greedy: bool,
                     sampling: tuple[float, int, float], stop=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue b token sequences (any lengths: prompt plus the episode so far) by up to
        `max_new` tokens each, one sample a row (the agent loop's turn, reinforge.agents.loop).
        -> ids (b, max_new) padded with pad_token_id after EOS, log-probs (b, max_new).
        `stop(rows, ids)` (reinforge.agents.loop.TurnStops): rows (k,) still decoding, ids (b, t)
        generated so far -> (k,) bool, the rows to end now (their budget, a parser's stop
        string); the lean loop calls it each step, generate() does not, so the caller cuts every
        row at its first stop as well."""
        ids, mask = pad(contexts, self.tok.pad_token_id, side="left")
        return self._generate_ids(ids, mask, 1, greedy, sampling, T=max_new, stop=stop)

    def generate(self, prompts: Batch, *, n: int, temperature: float = 1.0, greedy: bool = False) -> Batch:
        """prompts: non-tensor `prompt_ids` (token lists) and `uid` (B0,) int64 plus any per-prompt
        fields, which are repeated. Returns B = B0 * n rows with prompts (B, P), responses (B, T),
        input_ids / attention_mask (B, P+T), response_mask (B, T), group_ids (B,) and truncated (B,)
        bool (positions come from the attention mask wherever they are needed)."""
        ids, mask = pad_prompts(prompts["prompt_ids"], self.P, self.tok.pad_token_id)
        meta = sampling_meta(temperature, self.top_k, self.top_p, greedy)
        step = max(1, self.micro_batch_size // n)
        parts = [self._generate_ids(ids[i:i + step], mask[i:i + step], n, greedy,
                                    (meta["temperature"], meta["top_k"], meta["top_p"]),
                                    vision=chunk_vision(prompts, i, i + step))
                 for i in range(0, len(ids), step)]
        resp, logp = torch.cat([r for r, _ in parts]), torch.cat([lp for _, lp in parts])  # (B, T) each
        # generate() pads a row only after it emitted EOS, and a row without EOS ran to T tokens,
        # so every position up to the first EOS (or all T) was really generated.
        response_mask, truncated = finish_masks(resp, self.eos_ids, torch.full((len(resp),), self.T), self.ignore_eos)
        return assemble_rollout(prompts, ids, mask, resp, response_mask, truncated, n, meta,
                                {"rollout_log_probs": logp * response_mask})

