"""Ulysses sequence parallelism: one sequence (or packed row) split along its length over the k
ranks of a sequence-parallel group (`trainer.sequence_parallel=k`, docs/distributed.md, "Long
sequences").

Every rank of a group holds the same rows (workers/dp.py shards data over groups, not ranks) and
runs the decoder on its own contiguous slice of Lc = Lp / k positions (Lp: the row length padded
up to a multiple of k). Everything in a decoder layer but attention is per token, so it runs on
the slice unchanged; attention is the one place a token needs the others:

    q, k, v (b, heads, Lc, D)  --all-to-all-->  (b, heads / k, Lp, D)   sequence shards -> head shards
    sdpa over the whole row, this rank's heads, the row's full mask (causal, padding, packing)
    out (b, Lp, heads / k, D)  --all-to-all-->  (b, Lc, heads, D)       and back

(DeepSpeed-Ulysses, veRL's `ulysses_sequence_parallel_size`). Position ids are the row's global
ones, sliced, so RoPE is exact. The attention function is registered in transformers' attention
interface under ATTN_NAME and wraps sdpa. The group and the row's mask reach it as a keyword of
the model's forward (`reinforge_sp`), which transformers hands down to every attention call, so
activation checkpointing's recompute in the backward gets them too; without it (a rank's
generation copy) it is plain sdpa with the model's own mask.

The rows that feed the log-probs / values are spread over the group: each rank computes its own
(`Route`), and `Route.gather` all-gathers them into the whole (M,) vector in the order the
single-process path would give, so the losses, entropies and every reduction downstream see the
whole sequence. Its backward hands each rank the gradient of its own rows only: every rank of
the group computes the same loss on the same gathered vector, so its gradient for its own rows is
the whole loss's, and the parameters' gradients, each rank's from its own tokens, sum over the
group (FSDP's reduction over all ranks) to the whole sequence's.

Requires heads and key/value heads divisible by k (checked by the config and again here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

ATTN_NAME = "reinforge_ulysses"


@dataclass(frozen=True)
class SPGroup:
    """This rank's sequence-parallel group: `size` consecutive ranks, this one at `rank`."""

    group: object
    """The torch.distributed process group of the k ranks (None: the default group, k = world)."""
    rank: int
    size: int


_GROUP: SPGroup | None = None
"""The process's group, set once by `init_groups` (a rank of a Ray run); None: no SP."""


@dataclass(frozen=True)
class SPCall:
    """What one SP forward's attention calls need (the `reinforge_sp` keyword of the forward)."""

    group: SPGroup
    mask: torch.Tensor | None
    """(b, 1, Lp, Lp) bool, the whole row's (`full_mask`), or None: causal."""


def init_groups(k: int) -> SPGroup | None:
    """Collective (every rank, once): split the world into groups of k consecutive ranks and keep
    this rank's. k = 1: nothing (returns None)."""
    global _GROUP
    if k <= 1:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % k:
        raise ValueError(f"trainer.sequence_parallel={k} must divide the data-parallel world size {world}")
    mine = None
    for start in range(0, world, k):  # every rank creates every group (new_group is collective)
        g = dist.new_group(list(range(start, start + k)))
        if start <= rank < start + k:
            mine = g
    _GROUP = SPGroup(mine, rank % k, k)
    return _GROUP


def size() -> int:
    """k of this process (1: no sequence parallelism)."""
    return _GROUP.size if _GROUP is not None else 1


def attach(model) -> None:
    """Switch `model` (a causal LM or a critic, possibly in a PEFT wrapper) to the Ulysses
    attention when the process has a group; refuse heads that do not split."""
    if _GROUP is None:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from reinforge.config.validate import sequence_parallel_heads_rule
    from reinforge.models.forward import unwrap_peft

    AttentionInterface.register(ATTN_NAME, attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)  # outside an SP forward: sdpa's own masks
    inner = unwrap_peft(model)
    cfg = getattr(inner.config, "text_config", None) or inner.config
    heads = cfg.num_attention_heads
    rule = sequence_parallel_heads_rule(heads, getattr(cfg, "num_key_value_heads", None) or heads, _GROUP.size)
    if rule:
        raise ValueError(rule)
    if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        raise ValueError("trainer.sequence_parallel builds the whole row's causal mask: sliding-window attention "
                         "is not supported")
    if getattr(inner.config, "_attn_implementation", "sdpa") not in ("sdpa", ATTN_NAME):
        raise ValueError(f"trainer.sequence_parallel wraps sdpa; got model.attn_implementation="
                         f"{inner.config._attn_implementation}")
    inner.set_attn_implementation(ATTN_NAME)


# ---- the all-to-all and the gather, with their backwards ------------------------------------------
def _a2a(x: torch.Tensor, scatter_dim: int, gather_dim: int, g: SPGroup) -> torch.Tensor:
    """Split x in k along scatter_dim, send part j to rank j, concatenate what arrives along
    gather_dim in rank order."""
    x = torch.stack(x.chunk(g.size, dim=scatter_dim))  # (k, ...) part j for rank j
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=g.group)
    return torch.cat(out.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, g):
        ctx.dims, ctx.g = (scatter_dim, gather_dim), g
        return _a2a(x, scatter_dim, gather_dim, g)

    @staticmethod
    def backward(ctx, grad):
        s, gd = ctx.dims
        return _a2a(grad.contiguous(), gd, s, ctx.g), None, None, None


def attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention signature: q (b, H, Lc, D), k / v (b, KV, Lc, D) -> ((b, Lc, H, D),
    None). In an SP forward: all-to-all to (b, H/k, Lp, D), sdpa with the row's full mask, back."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sp = kwargs.pop("reinforge_sp", None)
    if sp is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    g, mask = sp.group, sp.mask
    q, k, v = (_AllToAll.apply(t.contiguous(), 1, 2, g) for t in (query, key, value))
    out, _ = sdpa_attention_forward(module, q, k, v, mask, **kwargs)  # (b, Lp, H/k, D)
    return _AllToAll.apply(out.contiguous(), 1, 2, g), None


class _GatherRows(torch.autograd.Function):
    """(m_r, ...) rows of each rank -> (M, ...) in `Route` order; backward: this rank's rows."""

    @staticmethod
    def forward(ctx, local, route):
        ctx.route = route
        g, counts = route.g, route.counts
        width = max(counts)
        pad = local.new_zeros((width,) + tuple(local.shape[1:]))
        pad[:local.shape[0]] = local
        parts = [torch.empty_like(pad) for _ in range(g.size)]
        dist.all_gather(parts, pad.contiguous(), group=g.group)
        out = local.new_empty((route.total,) + tuple(local.shape[1:]))
        for r, (part, pos) in enumerate(zip(parts, route.positions)):
            out[pos] = part[:counts[r]]
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.route.positions[ctx.route.g.rank]], None


@dataclass
class Route:
    """Where the M selected rows of a forward live: rank r holds `positions[r]` (indices into
    0..M-1, ascending) at flat offsets `local_index` (this rank's) of its (b * Lc) outputs."""

    g: SPGroup
    total: int
    positions: list
    counts: list
    local_index: torch.Tensor

    def take(self, out: torch.Tensor) -> torch.Tensor:
        """This rank's (b, Lc, X) output -> its selected rows (m_r, X)."""
        return out.reshape(-1, out.shape[-1])[self.local_index]

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """(m_r,) -> (M,): every rank's rows, in the single-process order (differentiable)."""
        return _GatherRows.apply(local, self)


def route(select: Callable, b: int, length: int, lc: int, g: SPGroup, device) -> Route:
    """Apply `select` ((b, L, X) -> (M, X), the caller's choice of rows) to the positions
    themselves, then split the chosen ones by the rank that holds them (position // Lc)."""
    flat = select(torch.arange(b * length, device=device).view(b, length, 1))[:, 0]  # (M,) b * L + l
    row, col = flat // length, flat % length
    owner = col // lc
    positions = [(owner == r).nonzero()[:, 0] for r in range(g.size)]
    mine = positions[g.rank]
    local_index = row[mine] * lc + (col[mine] - g.rank * lc)
    return Route(g, int(flat.numel()), positions, [int(p.numel()) for p in positions], local_index)


# ---- inputs: the row's full mask, this rank's slice -----------------------------------------------
def full_mask(attention_mask: torch.Tensor | None, position_ids: torch.Tensor) -> torch.Tensor | None:
    """The (b, 1, Lp, Lp) bool mask sdpa gets in the single-process forward: causal, keys that are
    real (a 2D 0/1 mask), and, for packed rows (no 2D mask), keys of the same sequence (a new one
    starts wherever the position ids do not go up by one, as transformers detects packing).
    None when that is the plain causal mask (sdpa then runs with is_causal, as transformers does)."""
    b, n = position_ids.shape
    if attention_mask is not None:
        keys = attention_mask.bool()  # (b, Lp)
        if bool(keys.all()):
            return None
        causal = torch.ones(n, n, dtype=torch.bool, device=keys.device).tril()
        return (causal[None] & keys[:, None, :])[:, None]
    step = torch.ones_like(position_ids, dtype=torch.bool)
    step[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    step[:, 0] = False
    if not bool(step.any()):
        return None
    seg = step.long().cumsum(-1)  # (b, Lp) sequence index within its row
    causal = torch.ones(n, n, dtype=torch.bool, device=seg.device).tril()
    return (causal[None] & (seg[:, :, None] == seg[:, None, :]))[:, None]


def split_inputs(fwd: dict, g: SPGroup) -> tuple[dict, torch.Tensor | None, int]:
    """The model's (b, L) inputs -> (this rank's (b, Lc) slice, the row's full mask, Lc). Rows are
    padded at the right to Lp = k * Lc: a padded slot is a real key (mask 1) or, packed, a
    sequence of its own (position 0); causality hides it from every real token."""
    ids, mask, pos = fwd["input_ids"], fwd.get("attention_mask"), fwd["position_ids"]
    b, n = ids.shape
    lc = -(-n // g.size)
    extra = lc * g.size - n
    if extra:
        ids = torch.cat([ids, ids.new_zeros(b, extra)], 1)
        pos = torch.cat([pos, pos.new_zeros(b, extra)], 1)
        mask = torch.cat([mask, mask.new_ones(b, extra)], 1) if mask is not None else None
    full = full_mask(mask, pos)
    cols = slice(g.rank * lc, (g.rank + 1) * lc)
    local = {**fwd, "input_ids": ids[:, cols], "position_ids": pos[:, cols], "attention_mask": full}
    return local, full, lc


def model_rows(call: Callable, fwd: dict, select: Callable) -> tuple[torch.Tensor, Route]:
    """`call(**local_fwd)` -> this rank's (b, Lc, X) output on its slice, under the Ulysses
    attention -> (its rows of `select` (m_r, X), their Route). fwd: the model's whole-row inputs
    (input_ids, attention_mask (2D) or None (packed rows), position_ids)."""
    g = _GROUP
    if fwd.get("attention_mask") is not None and fwd["attention_mask"].dim() != 2:
        raise ValueError("sequence parallelism takes a 2D attention mask or packed rows (None)")
    b, n = fwd["input_ids"].shape
    local, mask, lc = split_inputs(fwd, g)
    r = route(select, b, n, lc, g, fwd["input_ids"].device)
    out = call(**local, reinforge_sp=SPCall(g, mask))
    return r.take(out), r
