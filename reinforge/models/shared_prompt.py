"""Shared-prompt forwards: the n responses GRPO samples for one prompt share that prompt's forward.

A micro-batch of B rows holding U distinct prompts (n samples each), forwarded as whole rows,
runs every prompt's P tokens n times. Here each distinct prompt runs once, (U, P), keeping the
model's key/value cache; the cache rows are gathered to the B rows (an index: its backward sums
the n responses' gradients into the one prompt forward) and the responses (B, T) run on top of
it. Tokens through the decoder: U*P + B*T instead of B*(P + T); at the chain_sum demo's shape
(P = 39, T ~ 3, n = 8) that is ~5x fewer.

The attention, positions (from the whole row's mask: RoPE sees the same positions) and masks
are those of the whole rows, so log-probs, entropies and gradients agree with
`forward.response_logprobs` up to float rounding (tests/test_shared_prompt.py, fp32 at 1e-5).

It applies (`prompt_sharing_hidden`, else the whole rows run as before) when:
- the micro-batch has fewer distinct prompts than rows (rows of one group adjacent or not), on
  every data-parallel rank (`on_every_rank`: FSDP ranks must run the same forwards);
- the model's cache is a plain DynamicCache of full-attention layers (checked on the prompt
  forward's cache: sliding-window layers, as Gemma 3's, drop their oldest keys, and
  linear-attention layers keep a state, not keys: those models run whole rows);
- no activation checkpointing in a backward (HF's checkpointing turns the cache off).
Packed rows (model.use_packing) and vision-language prompts take their own paths (actor.py).
"""
from __future__ import annotations

import torch


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) left-padded prompt ids and 0/1 mask -> (first (U,): the first row of each distinct
    prompt, in order of first appearance; inverse (B,): each row's prompt in 0..U-1). Two rows
    share a prompt when their ids and mask are equal over all P positions."""
    B = prompt_ids.shape[0]
    key = torch.cat([prompt_ids.long(), prompt_mask.long()], dim=1)  # (B, 2P)
    _, inv = torch.unique(key, dim=0, return_inverse=True)  # sorted order: re-number by first row
    rows = torch.arange(B, device=key.device)
    first_of = torch.full((int(inv.max()) + 1,), B, dtype=torch.long, device=key.device)
    first_of.scatter_reduce_(0, inv, rows, reduce="amin")  # (U,) first row of each unique
    order = torch.argsort(first_of)  # uniques in order of their first row
    renumber = torch.empty_like(order)
    renumber[order] = torch.arange(len(order), device=key.device)
    return first_of[order], renumber[inv]


def _plain_cache(cache) -> bool:
    """Whether `cache` is a DynamicCache whose layers all keep every key (full attention)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def _cache_kwarg(backbone) -> str:
    """The forward's name for the key/value cache: `cache` (transformers >= 5.2x), else the older
    `past_key_values` (still accepted, deprecated, by the newer ones)."""
    import inspect

    return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"


def on_every_rank(flag: bool, device) -> bool:
    """`flag` where no process group runs; else True only when it holds on every rank. The ranks
    of an FSDP model must run the same forwards (each all-gathers the shards, and their backward
    reduce-scatters): one rank whose micro-batch repeats no prompt (a gateway's split sequences,
    dropped runs) makes every rank run whole rows, or the ranks' collectives would not line up."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    t = torch.tensor([0 if flag else 1], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t) == 0


def _checkpointing(backbone) -> bool:
    return bool(getattr(backbone, "gradient_checkpointing", False)) and backbone.training and torch.is_grad_enabled()


def prompt_sharing_hidden(backbone, response_len: int, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          position_ids: torch.Tensor) -> torch.Tensor:
    """The (B*T, H) last hidden states that predict the last T = `response_len` tokens of
    input_ids (B, P + T): row b's state before its response token t, flattened row-major, as
    `forward.response_logprobs`' `select` gives them. Each distinct prompt is forwarded once when
    that applies (module docstring); otherwise the whole rows are."""
    B, L = input_ids.shape
    T, P = response_len, L - response_len
    full = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)

    def whole_rows() -> torch.Tensor:
        h = backbone(**full, use_cache=False).last_hidden_state
        return h[:, -T - 1:-1].reshape(B * T, h.shape[-1])

    if P < 1 or T < 1 or _checkpointing(backbone):
        return whole_rows()
    first, inv = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
    if not on_every_rank(len(first) < B, input_ids.device):  # nothing shared: whole rows cost the same
        return whole_rows()
    prompt = backbone(input_ids=input_ids[first, :P], attention_mask=attention_mask[first, :P],
                      position_ids=position_ids[first, :P], use_cache=True)
    name = _cache_kwarg(backbone)
    cache = getattr(prompt, name)
    if not _plain_cache(cache):
        return whole_rows()
    cache.batch_select_indices(inv)  # (U, ...) -> (B, ...) per layer; differentiable indexing
    resp = backbone(input_ids=input_ids[:, P:], attention_mask=attention_mask, position_ids=position_ids[:, P:],
                    use_cache=True, **{name: cache}).last_hidden_state  # (B, T, H)
    last = prompt.last_hidden_state[:, -1][inv]  # (B, H): predicts response token 0 (left padding: real)
    h = torch.cat([last[:, None], resp[:, :-1]], dim=1)  # (B, T, H)
    return h.reshape(B * T, h.shape[-1])
