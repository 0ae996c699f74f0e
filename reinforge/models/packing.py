"""Sequence packing (padding removal) and token-budget micro-batches.

A rollout batch is (B, L) with a left-padded prompt and a right-padded response; with varied
lengths half of it can be padding, which the padded forward pass still pays for. Packing moves
each sequence's real tokens (attention_mask == 1, in order) into rows of C slots, several
sequences per row, first-fit decreasing:

    row 0: [seq 3 ........][seq 0 .....][pad]        position_ids 0 1 2 .. 0 1 2 .. 0
    row 1: [seq 1 .....][seq 2 .....][seq 5 ..]

Position ids restart at 0 for every sequence (RoPE sees the same positions as the padded path,
whose ids are `cumsum(mask) - 1`). Attention is kept inside each sequence by transformers'
packed-sequence format: with `attention_mask=None`, a causal LM in transformers >= 4.5x derives
a block-diagonal causal mask from position ids that restart (sdpa, eager, flex), and
flash-attention-2 turns them into varlen cu_seqlens. Tail slots of a row get position 0 each,
so every pad slot is its own one-token block and touches nothing real.

The row length C defaults to the longest sequence of the micro-batch: attention on CPU/sdpa is
dense per row, so rows as long as the whole micro-batch would cost O(N^2); rows of the longest
sequence keep the attention cost of the padded path while removing most rows.

Token-budget micro-batches (`token_budget_groups`): sequences are split into k groups with at
most `max_tokens` real tokens each (longest-processing-time greedy, so groups are balanced),
and k is agreed across data-parallel ranks (FSDP needs every rank to run the same number of
forward passes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reinforge.models.forward import position_ids_from_mask, token_logprobs, value_rows


# ---- planning ------------------------------------------------------------------------------
def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into bins of total <= capacity (longest first, first bin that fits)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"sequence of {n} tokens does not fit a packed row of {capacity}")
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins


def balanced_groups(lengths: list[int], k: int, max_count: int | None = None) -> list[list[int]]:
    """k groups of indices with near-equal token sums (longest first into the lightest group that
    has fewer than `max_count` members). Each group keeps its indices in ascending order, so
    results gather back deterministically; empty groups are dropped."""
    k = max(1, min(k, len(lengths)))
    groups: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        g = min((j for j in range(k) if max_count is None or len(groups[j]) < max_count), key=lambda j: (load[j], j))
        groups[g].append(i)
        load[g] += lengths[i]
    return [sorted(g) for g in groups if g]


def equal_count_partition(lengths: list[int], n: int) -> list[list[int]]:
    """n parts of len(lengths) / n indices each (len must divide), with near-equal token sums.
    Data-parallel ranks get the same number of sequences (same number of forward passes) and
    about the same work."""
    per = len(lengths) // n
    if per * n != len(lengths):
        raise ValueError(f"{len(lengths)} sequences do not split into {n} equal parts")
    return balanced_groups(lengths, n, max_count=per) if per else [[] for _ in range(n)]


def num_token_groups(lengths: list[int], max_tokens: int) -> int:
    """Smallest k (from the token total up) whose balanced split keeps every group <= max_tokens
    (a single sequence longer than the budget gets a group of its own)."""
    if not lengths:
        return 0
    k = max(1, math.ceil(sum(lengths) / max_tokens))
    while k < len(lengths):
        groups = balanced_groups(lengths, k)
        if all(sum(lengths[i] for i in g) <= max_tokens or len(g) == 1 for g in groups):
            break
        k += 1
    return min(k, len(lengths))


def _dp_max(k: int) -> int:
    """Max of k over data-parallel ranks (identity when torch.distributed is not initialised)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return k
    t = torch.tensor([k], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def token_budget_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Micro-batches by token budget, the same number on every rank (see module docstring)."""
    return balanced_groups(lengths, _dp_max(num_token_groups(lengths, max_tokens)))


def micro_batch_indices(attention_mask: torch.Tensor, micro_batch_size: int, max_tokens: int = 0) -> list[list[int]]:
    """Row groups of a (B, L) batch: fixed-size chunks, or token-budget groups when max_tokens > 0."""
    B = attention_mask.shape[0]
    if max_tokens <= 0:
        return [list(range(i, min(i + micro_batch_size, B))) for i in range(0, B, micro_batch_size)]
    return token_budget_groups(attention_mask.sum(-1).tolist(), max_tokens)


# ---- packing -------------------------------------------------------------------------------
@dataclass
class Packed:
    input_ids: torch.Tensor  # (R, C) packed tokens, pad slots 0
    position_ids: torch.Tensor  # (R, C) restart at 0 per sequence; 0 on pad slots
    dest: torch.Tensor  # (B, L) flat index into R*C of each original token; -1 where masked
    num_tokens: int  # real tokens


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, row_len: int | None = None) -> Packed:
    """(B, L) padded ids + 0/1 mask -> rows of packed sequences (see module docstring)."""
    valid = attention_mask.bool()  # (B, L)
    lengths = valid.sum(-1)  # (B,)
    C = int(row_len or max(int(lengths.max()), 1))
    rows = first_fit_decreasing(lengths.tolist(), C)
    start = torch.zeros_like(lengths)  # (B,) flat offset of each sequence's first token
    for r, members in enumerate(rows):
        off = r * C
        for i in members:
            start[i] = off
            off += int(lengths[i])
    pos = position_ids_from_mask(attention_mask)  # (B, L): 0..n-1 over the real tokens
    dest = torch.where(valid, start[:, None] + pos, torch.full_like(pos, -1))
    flat_ids = torch.zeros(len(rows) * C, dtype=input_ids.dtype, device=input_ids.device)
    flat_pos = torch.zeros(len(rows) * C, dtype=torch.long, device=input_ids.device)
    flat_ids[dest[valid]] = input_ids[valid]
    flat_pos[dest[valid]] = pos[valid]
    return Packed(flat_ids.view(len(rows), C), flat_pos.view(len(rows), C), dest, int(lengths.sum()))


def _response_gather(p: Packed, input_ids: torch.Tensor, response_len: int):
    """-> (sel (B, T) bool, src (M,) flat index of the hidden that predicts each selected token,
    labels (M,)). A response token is selected when it and its predecessor are real tokens."""
    T = response_len
    dest = p.dest
    sel = (dest[:, -T:] >= 0) & (dest[:, -T - 1:-1] >= 0)  # (B, T)
    return sel, dest[:, -T - 1:-1][sel], input_ids[:, -T:][sel]


def _scatter(sel: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(M,) values -> (B, T) with zeros where not selected (differentiable)."""
    return torch.zeros(sel.shape, dtype=values.dtype, device=values.device).masked_scatter(sel, values)


def packed_response_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, *,
                             temperature: float = 1.0, with_entropy: bool = False, fused: bool = True,
                             chunk_size: int | None = None, top_k: int = 0,
                             top_p: float = 1.0, vision: list | None = None,
                             row_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as `forward.response_logprobs` (B, L) -> (B, T), computed on packed rows
    (of `row_len` slots: `pack`'s). Positions that are not real response tokens hold 0 (the
    padded path leaves garbage there; both are masked downstream). vision: a VLM's B
    PromptImages or None (`packed_vision`)."""
    p = pack(input_ids, attention_mask, row_len)
    sel, src, labels = _response_gather(p, input_ids, response_len)
    fwd = dict(input_ids=p.input_ids, attention_mask=None, position_ids=p.position_ids)
    images = None
    if vision is not None and any(v is not None for v in vision):
        fwd["position_ids"], fwd["image_slots"], images = packed_vision(model, input_ids, attention_mask, vision, p)
    logp, ent = token_logprobs(model, fwd, lambda x: x.reshape(-1, x.shape[-1])[src], labels,
                               temperature=temperature, with_entropy=with_entropy, fused=fused, chunk_size=chunk_size,
                               top_k=top_k, top_p=top_p, images=images)
    return _scatter(sel, logp), (_scatter(sel, ent) if ent is not None else None)


def packed_vision(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: list,
                  p: Packed) -> tuple[torch.Tensor, torch.Tensor, list]:
    """A VLM batch's packed positions (4, R, C) (models/mrope.packed_mrope: the packed text
    positions, then each token's M-RoPE position computed on its own sequence), its image slots
    (R, C) and the rows' PromptImages in the order their slots sit in the packed rows (sequences
    by packed start). Slots and positions are the padded forward's (vlm_forward.image_inputs:
    the prompts' placeholders only, a response's sampled one is text) moved to the packed slots."""
    from reinforge.models.mrope import packed_mrope
    from reinforge.models.vlm_forward import image_inputs

    padded, slots, _ = image_inputs(model, input_ids, attention_mask, vision)  # (3, B, L), (B, L)
    valid = p.dest >= 0
    packed_slots = torch.zeros(p.input_ids.numel(), dtype=torch.bool, device=slots.device)
    packed_slots[p.dest[valid]] = slots[valid]
    start = torch.where(valid, p.dest, torch.full_like(p.dest, p.dest.numel() + p.input_ids.numel())).amin(-1)
    order = sorted(range(len(vision)), key=lambda i: int(start[i]))
    return (packed_mrope(padded, p.position_ids, p.dest), packed_slots.view_as(p.input_ids),
            [vision[i] for i in order if vision[i] is not None])


def packed_example_vision(model, input_ids: torch.Tensor, segment: torch.Tensor,
                          vision: list) -> tuple[torch.Tensor, torch.Tensor, list]:
    """packed_vision for rows already packed (SFT's: examples concatenated, each a segment
    1, 2, ... of its row, 0 on the padding): (R, C) ids and segments, the E examples'
    PromptImages (or None) in row then segment order -> positions (4, R, C), image slots (R, C)
    and the images in slot order. Each example is laid out alone (right-padded, E x Lmax) so its
    M-RoPE positions and prompt slots are the padded forward's, then moved back into its slots."""
    R, C = segment.shape
    spans = []  # (flat start, length) of each example, in row then segment order
    for r in range(R):
        segs = segment[r]
        for s in range(1, int(segs.max()) + 1):
            cols = (segs == s).nonzero()[:, 0]
            spans.append((r * C + int(cols[0]), len(cols)))
    if len(spans) != len(vision):
        raise ValueError(f"{len(vision)} PromptImages for {len(spans)} packed examples")
    Lmax = max(n for _, n in spans)
    col = torch.arange(Lmax, device=segment.device)
    start = torch.tensor([a for a, _ in spans], device=segment.device)
    length = torch.tensor([n for _, n in spans], device=segment.device)
    real = col[None] < length[:, None]  # (E, Lmax)
    dest = torch.where(real, start[:, None] + col[None], torch.full_like(real, -1, dtype=torch.long))
    ids = torch.where(real, input_ids.reshape(-1)[dest.clamp(min=0)], torch.zeros_like(dest))
    text_pos = torch.zeros(R * C, dtype=torch.long, device=segment.device)
    text_pos[dest[real]] = col.expand_as(dest)[real]  # restart at 0 per example, 0 on pads
    p = Packed(input_ids, text_pos.view(R, C), dest, int(length.sum()))
    return packed_vision(model, ids, real.long(), vision, p)


def packed_response_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           response_len: int) -> torch.Tensor:
    """Same contract as `forward.response_values` (B, L) -> (B, T), on packed rows."""
    p = pack(input_ids, attention_mask)
    sel, src, _ = _response_gather(p, input_ids, response_len)
    fwd = dict(input_ids=p.input_ids, attention_mask=None, position_ids=p.position_ids)
    return _scatter(sel, value_rows(critic, fwd, lambda x: x.reshape(-1, x.shape[-1])[src]))


def micro_batches(batch, micro_batch_size: int, max_tokens: int = 0):
    """-> (sub-batches, order): `order` lists the original row of every output row, so
    `restore_order(torch.cat(results), order)` puts per-row results back in batch order."""
    groups = micro_batch_indices(batch["attention_mask"], micro_batch_size, max_tokens)
    return [batch.index(g) for g in groups], [i for g in groups for i in g]


def restore_order(t: torch.Tensor, order: list[int]) -> torch.Tensor:
    out = torch.empty_like(t)
    out[torch.as_tensor(order, device=t.device)] = t
    return out
