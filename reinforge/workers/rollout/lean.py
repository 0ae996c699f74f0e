"""A lean decoding loop (`rollout.backend: lean`): the HF model's own layers, no generate().

transformers' generate() pays, at every token, for its logits processors, stopping criteria,
cache classes and the attention-mask builders. Decoding here calls the model's embedding,
rotary embedding, decoder layers, final norm and LM head directly (so the module's own
parameters, LoRA layers included, are used: nothing to copy or sync), with:
- a static KV cache preallocated for P + T positions, handed to each attention module as its
  `cache` (the `update(k, v, layer_idx)` contract), so a step appends in place;
- prefix sharing: each prompt is prefilled once and its cache repeated for its n samples;
- sampling on tensors: temperature, `sampling_filter_` (top-k, top-p) and one multinomial
  draw; the log-prob of the drawn token comes from the same log-softmax (`rollout_log_probs`);
- finished rows dropped from the batch (cache, mask and positions compacted);
- `rollout.dtype=bfloat16` (the plan's `auto` for large fp32 models on bf16-native devices):
  decoding from a bf16 copy of the weights, made for each generation (decode_weights.py);
- on a CPU, every linear layer's weight reordered once per generation into oneDNN's layout
  (packed_linears.py: bf16 always, bit-identical; fp32 for models of >= 100M parameters),
  instead of at every call;
- for large vocabularies (>= LARGE_VOCAB ids), sampling by the inverse CDF of one uniform
  draw per row (`sample_large_vocab`) instead of torch.multinomial, whose exponential-race
  kernel draws V random numbers per row (~10x the cost at V = 152k); same distribution,
  another random stream, so smaller vocabularies keep multinomial's samples bit for bit. The
  CDF is the cumulative sum of exp(z - max z), which also gives the log-partition, so no
  (b, V) log-softmax is built.
- partial rollouts (rollout.partial; `generate(..., refresh=, version=)`): before sampling
  response position t >= 1 the loop calls refresh(t); when it returns a new version (the
  caller has loaded its weights into the module), the KV cache of the rows still decoding is
  recomputed under the new weights (one prefill of prompt + the t tokens so far), so every
  later token's recorded log-prob is exactly the new version's, as the trainer will score it;
  keeping the old cache would make those log-probs a mix of two policies (image prompts: the
  re-prefill takes the prompt's image features and M-RoPE positions, workers/rollout/vlm.py).
  `token_versions` (B, T) records the version that sampled each token.
- MoE policies (Qwen3-MoE, Qwen2-MoE, Mixtral: the same layer signature) with routing replay on
  (actor.router_replay=rollout): the routers' chosen experts of every forward (prefill, each
  step, a partial rollout's re-prefill, which overwrites the rows' earlier positions with the
  new weights' choice) placed at their (row, column) in `routed_experts` (B, P+T, layers, k)
  (models/moe.py); a position no forward read (a row's last token and the padding after it) stays
  unrouted.
Qwen2 / Qwen3 / Llama configs with full attention only (their decoder layers share one call
signature), the MoE ones above, and Qwen2-VL's language model (image prompts: the prefill takes the prompt's
embeddings with the image features and M-RoPE positions, workers/rollout/vlm.py); other
architectures fall back to HFRollout's generate(). Same Batch as HFRollout.

Shapes: B0 prompts, n samples each, b rows still decoding, P prompt, T response, S = P + T,
Hk key/value heads, D head dim, V vocabulary.
"""
from __future__ import annotations

import functools
import inspect

import torch

from reinforge.algos.logprobs import filter_active, sampling_filter_, sampling_log_probs
from reinforge.models.forward import unwrap_peft
from reinforge.models.moe import routing_of, unrouted
from reinforge.workers.rollout.base import LEAN_MODEL_TYPES, RolloutCapabilities
from reinforge.workers.rollout.decode_weights import DTYPES, cast_weights
from reinforge.workers.rollout.hf import HFRollout
from reinforge.workers.rollout.packed_linears import linear_only_weights, packed_linears, should_pack

SUPPORTED = LEAN_MODEL_TYPES  # VLMs: their language model, images via vlm.py
LARGE_VOCAB = 1 << 16
"""Vocabularies from which sampling uses `sample_inverse_cdf` (the demo's has 99 ids)."""


def sample_inverse_cdf(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of probs (b, V) (unnormalised, >= 0): the first index whose cumulative
    mass reaches u x total, u uniform in (0, 1]. A zero-probability token is never drawn (its
    cumulative mass equals its predecessor's, which is reached first; u > 0 keeps index 0 out
    when it has no mass). -> (b,) int64."""
    cdf = probs.float().cumsum(-1)  # (b, V)
    u = 1.0 - torch.rand(probs.shape[0], 1, generator=generator, device=probs.device)  # (0, 1]
    tok = torch.searchsorted(cdf, u * cdf[:, -1:])[:, 0]
    return tok.clamp_(max=probs.shape[-1] - 1)


def sample_large_vocab(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                       generator: torch.Generator | None = None,
                       work: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, V) logits -> tokens (b,) drawn from softmax(filter(logits / T)) by `sample_inverse_cdf`'s
    rule (the same one uniform per row), and their log-probs (b,). One unnormalised
    e = exp(z - max z) is both the CDF (its cumulative sum) and the normaliser (lse = max +
    log sum e), instead of a (b, V) log-softmax, its exp and a division by T = 1: at V = 152k these
    (b, V) passes cost about half of a bf16 decode step's head matmul on a 4-layer model.
    work: an fp32 buffer of at least (b, V) for the CDF (the lean loop's, reused every token: a
    fresh 10 MB tensor a token is page-faulted anew); the same values either way."""
    z = logits.float()
    if temperature != 1.0 or filter_active(z.shape[-1], top_k, top_p):
        z = z / temperature  # a copy: the filter below writes in place
        sampling_filter_(z, top_k, top_p)
    m = z.amax(-1, keepdim=True)  # (b, 1)
    cdf = (z - m if work is None else torch.sub(z, m, out=work[:z.shape[0]])).exp_().cumsum_(-1)  # (b, V)
    total = cdf[:, -1:]
    u = 1.0 - torch.rand(z.shape[0], 1, generator=generator, device=z.device)  # (0, 1]
    tok = torch.searchsorted(cdf, u * total)[:, 0].clamp_(max=z.shape[-1] - 1)
    return tok, z.gather(-1, tok[:, None])[:, 0] - (m[:, 0] + total[:, 0].log())


def lean_supported(model) -> bool:
    """Whether the decoder is one whose layers this loop can drive (full attention only)."""
    inner = unwrap_peft(model)
    cfg = inner.config
    text = getattr(cfg, "text_config", None) or cfg  # a VLM's language model
    layer_types = getattr(text, "layer_types", None) or ["full_attention"]
    return (cfg.model_type in SUPPORTED and set(layer_types) == {"full_attention"}
            and text._attn_implementation in ("sdpa", "eager") and hasattr(inner, "model"))


@functools.lru_cache(maxsize=None)
def cache_keyword(layer_cls: type) -> str:
    """The keyword a decoder layer's forward takes its KV cache under, read from its signature
    (a feature check, not a version test): `cache` in transformers 5.24, `past_key_values` in
    5.17, `past_key_value` in 4.x."""
    params = inspect.signature(layer_cls.forward).parameters
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in params:
            return name
    raise TypeError(f"{layer_cls.__name__}.forward takes no KV cache argument this loop knows; use rollout.backend=hf")


class StaticCache:
    """Keys and values (B, Hk, S, D) per layer, preallocated; `update` is what the attention
    modules call: it writes the L new positions at `pos` and returns the filled prefix."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], pos: int = 0):
        self.keys, self.values, self.pos = keys, values, pos

    @classmethod
    def empty(cls, n_layers: int, shape: tuple, dtype, device) -> "StaticCache":
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)])

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        end = self.pos + k.shape[2]
        self.keys[layer_idx][:, :, self.pos:end] = k
        self.values[layer_idx][:, :, self.pos:end] = v
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def rows(self, index: torch.Tensor) -> "StaticCache":
        """The cache of rows `index` (a repeat for prefix sharing, a subset to drop rows)."""
        return StaticCache([k.index_select(0, index) for k in self.keys],
                           [v.index_select(0, index) for v in self.values], self.pos)


_TOLD: set = set()  # model types whose fallback was announced (once a process)


def _say_fallback(cfg) -> None:
    """One stderr line, once per model type, that the lean loop falls back to generate()."""
    import sys

    kind = cfg.model_type
    if kind not in _TOLD:
        _TOLD.add(kind)
        print(f"[reinforge] rollout.backend=lean: the lean loop does not drive model_type {kind!r} (it drives "
              f"{', '.join(SUPPORTED)} with full attention); generating with transformers' generate(), as "
              "rollout.backend=hf does", file=sys.stderr)


class LeanRollout(HFRollout):
    """HFRollout with the decoding loop above (generate() for unsupported architectures).

    `generator`, sampling's random source, is torch's global one (None) unless set: the
    asynchronous producer's copy draws from its own (trainers/async_rollout.py), which no other
    thread moves or restores; so only a model this loop drives can run in the producer."""

    def __init__(self, model, tokenizer, *, dtype: str = "model", **kw):
        """dtype: `model` decodes with the weights as they are; `bfloat16` / `float16` from a
        copy in that dtype, made for each generation (the plan resolves rollout.dtype=auto)."""
        super().__init__(model, tokenizer, **kw)
        self.lean = lean_supported(model)
        self.capabilities = RolloutCapabilities(async_ok=self.lean)
        if not self.lean:
            _say_fallback(unwrap_peft(model).config)
        if dtype not in ("model", *DTYPES):
            raise ValueError(f"rollout.dtype={dtype!r} is not known; valid: {['model', *DTYPES]} (or auto in a config)")
        self.decode_dtype = DTYPES.get(dtype)
        self.pack = True
        """Reorder the linear weights once per generation where that pays (packed_linears.py);
        False: every layer's own forward (a test's reference)."""
        self._partial = None  # during a partial generation: [refresh, current version, token_versions parts]
        self._route_parts = None  # while a generation records MoE routing: each chunk's (b, P+T, layers, k)

    @property
    def supports_refresh(self) -> bool:
        """generate(refresh=...) swaps weights mid-generation: the lean loop on the module's own
        weights (a bf16/fp16 decoding copy would not see the new ones)."""
        return self.lean and self.decode_dtype is None

    def generate(self, prompts, *, n: int, temperature: float = 1.0, greedy: bool = False, refresh=None,
                 version: int = 0):
        """HFRollout.generate; with `refresh` (behaviour.Refresh) a partial rollout starting at
        `version`, adding token_versions (B, T) int64 (beyond a row's end: its last version)."""
        routing = routing_of(self.model)
        self._route_parts = [] if self.lean and routing is not None and routing.replay_enabled else None
        try:
            batch = self._generate(prompts, n, temperature, greedy, refresh, version)
        finally:
            parts, self._route_parts = self._route_parts, None
        if parts:
            batch["routed_experts"] = torch.cat(parts)
        return batch

    def _generate(self, prompts, n, temperature, greedy, refresh, version):
        if refresh is None:
            return super().generate(prompts, n=n, temperature=temperature, greedy=greedy)
        if not self.supports_refresh:
            raise NotImplementedError("partial rollouts need the lean loop on the model's own weights")
        self._partial = [refresh, version, []]
        try:
            batch = super().generate(prompts, n=n, temperature=temperature, greedy=greedy)
            tv = torch.cat(self._partial[2])
        finally:
            self._partial = None
        batch["token_versions"] = tv.cummax(dim=1).values  # fill each row's end with its last version
        return batch

    @classmethod
    def from_config(cls, model, tokenizer, r, *, max_prompt_length: int):
        """The registry's build: HFRollout's keywords plus rollout.dtype (`auto` unresolved: model)."""
        dtype = getattr(r, "dtype", "model")
        return cls(model, tokenizer, max_prompt_length=max_prompt_length, max_response_length=r.max_response_length,
                   micro_batch_size=r.micro_batch_size, top_p=r.top_p, top_k=r.top_k, ignore_eos=r.ignore_eos,
                   dtype="model" if dtype == "auto" else dtype)

    def _parts(self):
        """(inner HF causal LM, its backbone) looking through a PEFT wrapper (a VLM's: its
        language model)."""
        inner = unwrap_peft(self.model)
        return inner, getattr(inner.model, "language_model", inner.model)

    def _forward(self, backbone, head, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                 cache: StaticCache, embeds: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """ids, pos (b, L) (a VLM's prefill: (3, b, L)); mask (b, 1, L, cache.pos + L) bool, True =
        attend; embeds (b, L, H): the input embeddings when not ids' own; out: an fp32 buffer of
        at least (b, V) to hold them (reused across tokens) -> last logits (b, V) fp32."""
        h = backbone.embed_tokens(ids) if embeds is None else embeds
        rope = backbone.rotary_emb(h, pos)
        if backbone.config._attn_implementation == "eager":  # eager adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill_(~mask, torch.finfo(h.dtype).min)
        for layer in backbone.layers:
            h = layer(h, attention_mask=mask, position_embeddings=rope, position_ids=pos,
                      **{cache_keyword(type(layer)): cache})
        cache.pos += ids.shape[1]
        logits = head(backbone.norm(h[:, -1:]))[:, 0]
        return logits.float() if out is None else out[:len(logits)].copy_(logits)

    def _pick(self, logits: torch.Tensor, greedy: bool, sampling: tuple[float, int, float], work=None):
        """(b, V) logits -> tokens (b,) and their log-probs (b,) under the sampled distribution
        (work: sample_large_vocab's buffer)."""
        temperature, top_k, top_p = sampling
        if greedy:
            tok = logits.argmax(-1)
            return tok, logits.log_softmax(-1).gather(-1, tok[:, None])[:, 0]
        if logits.shape[-1] >= LARGE_VOCAB:
            return sample_large_vocab(logits, temperature, top_k, top_p, self.generator, work)
        logp = sampling_log_probs(logits, temperature, top_k, top_p)
        tok = torch.multinomial(logp.exp(), 1, generator=self.generator)[:, 0]
        return tok, logp.gather(-1, tok[:, None])[:, 0]

    @torch.no_grad()
    def _generate_ids(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, greedy: bool,
                      sampling: tuple[float, int, float], T: int | None = None,
                      stop=None, vision: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = self.decode_dtype or next(self.model.parameters()).dtype
        # not in a partial rollout: its refresh loads new weights into the modules mid-generation
        pack = self.lean and self.pack and self._partial is None and should_pack(self.model, dtype)
        # a packed linear weight is cast as it is packed, not in the whole-model copy (~0.7 GB less at 0.5B)
        later = linear_only_weights(self.model) if pack and self.decode_dtype is not None else frozenset()
        with cast_weights(self.model, self.decode_dtype, skip=later):
            if not self.lean:
                return super()._generate_ids(prompt_ids, prompt_mask, n, greedy, sampling, T, vision=vision)
            with packed_linears(self.model, len(prompt_ids) * n, pack, dtype=dtype):
                return self._lean_ids(prompt_ids, prompt_mask, n, greedy, sampling, T, stop, vision)

    def _lean_ids(self, prompt_ids, prompt_mask, n, greedy, sampling, T, stop, vision=None):
        inner, backbone = self._parts()
        head, was_training = inner.get_output_embeddings(), self.model.training
        device, dtype = backbone.embed_tokens.weight.device, backbone.embed_tokens.weight.dtype
        routing = routing_of(self.model)
        if routing is not None:  # record for generate(); never a replay left set by another forward
            routing.select("record" if self._route_parts is not None else None)
        self.model.eval()
        try:
            return self._decode(backbone, head, prompt_ids.to(device), prompt_mask.to(device).bool(), n, greedy,
                                sampling, dtype, T or self.T, stop, vision)
        finally:
            self.model.train(was_training)
            if routing is not None:
                routing.clear()

    def _prefill(self, backbone, head, ids, pmask, mask, cache, vision=None):
        """The prompts' forward -> (last logits (B0, V), each row's next position (B0,)). Text:
        positions from the mask; a VLM's image prompts: embeddings with the image features and
        M-RoPE positions (workers/rollout/vlm.prefill_inputs)."""
        if vision is None:
            pos = (pmask.long().cumsum(-1) - 1).clamp(min=0)
            return self._forward(backbone, head, ids, pos, mask[:, None], cache), pmask.sum(-1)
        from reinforge.workers.rollout.vlm import prefill_inputs

        embeds, pos, nxt = prefill_inputs(self.model, backbone.embed_tokens, ids, pmask, vision)
        return self._forward(backbone, head, ids, pos, mask[:, None], cache, embeds), nxt

    def _decode(self, backbone, head, ids, pmask, n, greedy, sampling, dtype, T, stop=None, vision=None):
        """(B0, P) prompts -> responses (B0 * n, T) padded with pad_token_id, log-probs (B0 * n, T).
        `stop` (HFRollout.continue_ids) ends rows early as EOS does; vision: a VLM's B0
        PromptImages or None."""
        B0, P = ids.shape
        S, dev, cfg = P + T, ids.device, backbone.config
        kv_shape = (B0, cfg.num_key_value_heads, S, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        cache = StaticCache.empty(cfg.num_hidden_layers, kv_shape, dtype, dev)
        # Prefill: causal over real prompt tokens; a left pad attends to itself only (no empty rows).
        keys = torch.zeros(B0, S, dtype=torch.bool, device=dev)
        keys[:, :P] = pmask
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        mask = (causal & pmask[:, None, :]) | torch.eye(P, dtype=torch.bool, device=dev)
        logits, next_pos = self._prefill(backbone, head, ids, pmask, mask, cache, vision)  # (B0, V), (B0,)
        # Prefix sharing: n rows per prompt, interleaved like generate's num_return_sequences.
        rep = torch.arange(B0, device=dev).repeat_interleave(n)
        cache, keys, logits = cache.rows(rep), keys[rep], logits[rep]
        next_pos = next_pos[rep]  # (B,) position of the first response token
        B = B0 * n
        rec = routing_of(self.model) if self._route_parts is not None else None
        if rec is not None:  # (B, S, layers, k): the prompts' routing, shared by their n rows
            routes = torch.full((B, S, rec.layers, rec.top_k), unrouted(rec.dtype), dtype=rec.dtype, device=dev)
            routes[:, :P] = rec.take_recorded(B0, P)[rep]
        resp = torch.full((B, T), self.tok.pad_token_id, dtype=torch.long, device=dev)
        logps = torch.zeros(B, T, device=dev)
        rows = torch.arange(B, device=dev)  # the output row of each row still decoding
        eos = torch.as_tensor(self.eos_ids, device=dev)
        partial = self._partial
        versions = torch.full((B, T), -1, dtype=torch.long) if partial is not None else None
        # Large vocabularies: the logits and the sampler's CDF in two (B, V) buffers kept for the loop.
        big = logits.shape[-1] >= LARGE_VOCAB
        buf, work = (torch.empty_like(logits), torch.empty_like(logits)) if big else (None, None)
        for t in range(T):
            if partial is not None and t > 0 and (v := partial[0](t)) is not None:
                partial[1] = v  # new weights: recompute the cache of the rows still decoding under them
                cache, logits = self._prefill_again(backbone, head, ids[rep[rows]], resp[rows, :t],
                                                    keys[:, :P + t], dtype, S,
                                                    None if vision is None else [vision[i] for i in rep[rows].tolist()])
                if rec is not None:  # the new weights' routing of everything the rows have so far
                    routes[rows, :P + t] = rec.take_recorded(len(rows), P + t)
            if versions is not None:
                versions[rows.cpu(), t] = partial[1]
            tok, lp = self._pick(logits, greedy, sampling, work)
            resp[rows, t], logps[rows, t] = tok, lp
            if t == T - 1:
                break
            keys[:, P + t] = True
            if not self.ignore_eos or stop is not None:
                alive = torch.ones_like(tok, dtype=torch.bool) if self.ignore_eos else ~torch.isin(tok, eos)
                if stop is not None:
                    alive &= ~stop(rows, resp[:, :t + 1]).to(dev)
                if not alive.all():  # drop finished rows: compact everything that has a batch dim
                    keep = alive.nonzero()[:, 0]
                    if len(keep) == 0:
                        break
                    cache, keys, rows, tok, next_pos = cache.rows(keep), keys[keep], rows[keep], tok[keep], next_pos[keep]
            logits = self._forward(backbone, head, tok[:, None], (next_pos + t)[:, None],
                                   keys[:, None, None, :P + t + 1], cache, out=buf)
            if rec is not None:  # token t of each row still decoding sits at column P + t
                routes[rows, P + t] = rec.take_recorded(len(rows), 1)[:, 0]
        if versions is not None:
            partial[2].append(versions)
        if rec is not None:
            self._route_parts.append(routes.cpu())
        return resp.cpu(), logps.cpu()

    def _prefill_again(self, backbone, head, prompt_ids, generated, keys, dtype, S, vision=None):
        """A fresh cache for b rows: prompt_ids (b, P) + generated (b, t) under the current weights,
        keys (b, P + t) the attended positions -> (cache at P + t, next logits (b, V)). vision:
        the b rows' PromptImages (a VLM's image prompts, or None): the prompt's image features
        (encoded by the current tower) in its placeholders and M-RoPE positions, as the trainer's
        forward builds them (workers/rollout/vlm.refill_inputs), so a token sampled after the
        switch has the new weights' log-prob whatever the image."""
        cfg, dev = backbone.config, prompt_ids.device
        seq = torch.cat([prompt_ids, generated], dim=1)
        L = seq.shape[1]
        kv_shape = (len(seq), cfg.num_key_value_heads, S,
                    getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        cache = StaticCache.empty(cfg.num_hidden_layers, kv_shape, dtype, dev)
        causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
        mask = (causal & keys[:, None, :]) | torch.eye(L, dtype=torch.bool, device=dev)
        if vision is None:
            pos = (keys.long().cumsum(-1) - 1).clamp(min=0)
            return cache, self._forward(backbone, head, seq, pos, mask[:, None], cache)
        from reinforge.workers.rollout.vlm import refill_inputs

        embeds, pos = refill_inputs(self.model, seq, keys, vision)
        return cache, self._forward(backbone, head, seq, pos, mask[:, None], cache, embeds)
