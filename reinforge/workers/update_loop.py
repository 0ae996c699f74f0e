"""The one update loop of every trained model (actor, critic, SFT, DPO, RM), its one optimizer-step
site and its one non-finite policy:

    for mini in mini_batches:                            # one optimizer step each
        for micro, share in mini.micros:                 # exact gradient accumulation
            out  = forward(micro)                        # once, read by every loss term
            loss = sum(term.coef * term.fn(out, micro, mini.denom))
            (loss * world_size).backward()               # FSDP averages gradients over ranks
        Optim.step: clip, every rank finite?, step or skip, NonFiniteGuard

A loss term returns its loss already normalised by the *mini-batch's* denominators (token and
sequence counts, pairs), so the micro-batch losses add up to the mini-batch loss and the summed
gradient is the mini-batch's whatever the split. Metrics follow the same rule: a name ending in
"loss" adds up over micro-batches; any other metric is a mean over its micro-batch and is
weighted by the micro-batch's `share` of the mini-batch (its response tokens for RL, its rows or
pairs for SFT / DPO / RM), so it is the mini-batch's mean. Each mini-batch then counts once:
`UpdateResult.metrics` divides by the number of mini-batches. A name ending in "_max" is a
maximum over every micro-batch, mini-batch and rank instead (MetricSum). Without an `Optim` the
same loop evaluates (no backward, no step): the held-out pairs of DPO / RM.

The forward-only passes (old and reference log-probs, values, sum pi^2) share `map_micro_batches`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from reinforge.algos import kept_grads
from reinforge.models.packing import micro_batches, restore_order
from reinforge.protocol import Batch
from reinforge.workers import dp

Metrics = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LossTerm:
    """One summand of a model's loss: `coef * fn(outputs, micro, denom)[0]`."""

    name: str
    """Metric name of the term's value ("pg_loss", "vf_loss", "loss", ...); ends in "loss"."""
    coef: float
    """Its weight in the summed loss (negative for a bonus: the entropy term)."""
    fn: Callable[[Any, Any, Any], tuple[torch.Tensor, Metrics]]
    """(forward outputs, micro-batch, mini-batch denominators) -> (loss normalised by the
    mini-batch, metric tensors)."""
    moments: Callable[[Any, Any], Metrics] | None = None
    """(forward outputs, micro-batch) -> sums that add up over micro-batches and ranks."""
    summary: Callable[[Metrics], Metrics] | None = None
    """The mini-batch's metrics from its summed `moments` (the critic's explained variance)."""


@dataclass
class MiniBatch:
    """One optimizer step's data: the denominators every term normalises by, and its micro-batches
    (lazily, so each goes to the device only when it runs) with their metric shares."""

    denom: Any
    """agg_denominators of the mini-batch (RL), its target-token count (SFT) or its pairs (DPO, RM)."""
    micros: Iterable[tuple[Any, float]]
    """(micro-batch, its share of the mini-batch's metric weight), shares summing to 1."""


def is_max_metric(name: str) -> bool:
    """A metric whose name ends in "_max" is a maximum: it reduces by max over micro-batches,
    mini-batches and ranks (a weighted mean of maxima is no maximum, and a mean would hide the
    one outlier token it exists to show)."""
    return name.endswith("_max")


class MetricSum:
    """Weighted sums of metric tensors (maxima for `*_max` names), read out as floats once per
    update (one sync)."""

    def __init__(self):
        self.sums: Metrics = {}
        self.maxes: Metrics = {}

    def add(self, metrics: Metrics, weight: float) -> None:
        for k, v in metrics.items():
            v = v.detach().float() if torch.is_tensor(v) else torch.tensor(float(v))
            if is_max_metric(k):  # the weight is a share of a mean: a maximum ignores it
                self.maxes[k] = torch.maximum(self.maxes[k], v) if k in self.maxes else v
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * weight

    def all_reduce(self) -> "MetricSum":
        """Sum (maxima: max) over data-parallel ranks (each rank added its share of the global
        mini-batch). Every rank holds the same names: the same terms ran on every rank. The k ranks
        of a sequence-parallel group added the same (whole-sequence) values: the sum counts them once."""
        if self.sums and dp.world_size() > 1:
            keys = sorted(self.sums)
            flat = dp.all_reduce_sum_(torch.stack([torch.as_tensor(self.sums[k]).float().cpu() for k in keys]))
            flat = flat / dp.sp_size() if dp.sp_size() > 1 else flat
            self.sums = dict(zip(keys, flat))
        if self.maxes and dp.world_size() > 1:
            import torch.distributed as dist

            keys = sorted(self.maxes)
            flat = torch.stack([self.maxes[k].float().cpu() for k in keys])
            dist.all_reduce(flat, op=dist.ReduceOp.MAX)
            self.maxes = dict(zip(keys, flat))
        return self

    def result(self, prefix: str, count: int) -> dict[str, float]:
        """Sums as means over `count` mini-batches; maxima as they are."""
        out = {f"{prefix}{k}": float(v) / max(count, 1) for k, v in self.sums.items()}
        out.update({f"{prefix}{k}": float(v) for k, v in self.maxes.items()})
        return out


# ---- the one optimizer-step site and the one non-finite policy ---------------------------------
class NonFiniteGuard:
    """Counts consecutive skipped updates and aborts the run after `limit` in a row (the config's
    `max_nonfinite_steps` of the trained role: actor.*, critic.*, optim.*)."""

    def __init__(self, limit: int, who: str):
        self.limit, self.who, self.in_a_row, self.total = limit, who, 0, 0

    def record(self, ok: bool) -> None:
        if ok:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.total += 1
        if self.in_a_row >= self.limit:
            raise FloatingPointError(
                f"{self.who}: {self.in_a_row} consecutive updates had a non-finite loss or gradient; "
                f"stopping (lower the learning rate or check the rewards)")


def clip_and_step(params, opt, grad_clip: float) -> tuple[torch.Tensor, bool]:
    """Clip the global grad norm and step, unless the gradient is not finite (then skip)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    ok = bool(torch.isfinite(grad_norm))
    if ok:
        opt.step()
    kept_grads.release_optimizer(opt)  # zero_grad(set_to_none=True), a real vocabulary's head gradient kept warm
    return grad_norm.detach(), ok


@dataclass
class Optim:
    """What one optimizer step needs: the trained parameters, their optimizer, the clip and the
    guard (the worker's own objects, so checkpoints and tests see the same ones)."""

    params: list
    opt: torch.optim.Optimizer
    grad_clip: float
    """Clip the global gradient norm to this (0: no clipping)."""
    guard: NonFiniteGuard

    def step(self, finite_loss: bool) -> tuple[torch.Tensor, bool]:
        """-> (grad norm before clipping, stepped). Steps only when every rank's loss and the
        global gradient are finite; a skip zeroes the gradients and its norm is NaN."""
        if dp.all_true(finite_loss):  # every rank takes the same branch (the clip is a collective)
            grad_norm, ok = clip_and_step(self.params, self.opt, self.grad_clip)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP's DTensor
        else:
            kept_grads.release_optimizer(self.opt)
            grad_norm, ok = torch.tensor(math.nan), False
        self.guard.record(ok)
        return grad_norm, ok


# ---- the loop -----------------------------------------------------------------------------------
@dataclass
class UpdateResult:
    sums: MetricSum = field(default_factory=MetricSum)
    """Loss terms and their metrics, summed over micro-batches (this rank's shares)."""
    shared: MetricSum = field(default_factory=MetricSum)
    """Per-mini-batch values already global: the grad norm, the terms' summaries."""
    n_mini: int = 0
    skipped: int = 0
    """Optimizer steps skipped for a non-finite loss or gradient."""

    def metrics(self, prefix: str) -> dict[str, float]:
        """Means over the mini-batches, as `<prefix>name`; the grad norm is `<prefix>grad_norm`
        for every trained model (actor/, critic/, train/ for SFT, none for DPO and RM)."""
        out = {**self.sums.all_reduce().result(prefix, self.n_mini), **self.shared.result(prefix, self.n_mini)}
        if f"{prefix}grad_norm" in out:
            out[f"{prefix}nonfinite_skipped"] = float(self.skipped)
        return out


def micro_loss(terms: Sequence[LossTerm], outputs, micro, denom) -> tuple[torch.Tensor, Metrics]:
    """The summed loss of one micro-batch's forward `outputs` and every term's metrics, the
    terms' own values under their names. Terms are added in list order."""
    total, metrics = None, {}
    for term in terms:
        loss, m = term.fn(outputs, micro, denom)
        metrics.update(m)
        metrics[term.name] = loss
        total = term.coef * loss if total is None else total + term.coef * loss
    return total, metrics


def run_update(minis: Iterable[MiniBatch], terms: Sequence[LossTerm], *, forward: Callable[[Any], Any] | None = None,
               optim: Optim | None = None) -> UpdateResult:
    """Run `terms` over every micro-batch of every mini-batch, one optimizer step per mini-batch
    (`optim`; None: evaluate only). `forward(micro)` runs once per micro-batch (None: the terms
    read the micro-batch itself). A non-finite loss skips its mini-batch's step; alone, the rest
    of that mini-batch is not even run (in a group every rank must run the same collectives)."""
    res, world = UpdateResult(), dp.world_size()
    for mini in minis:
        res.n_mini += 1
        finite, moments = True, MetricSum()
        for micro, share in mini.micros:
            out = forward(micro) if forward is not None else micro
            loss, m = micro_loss(terms, out, micro, mini.denom)
            for term in terms:
                if term.moments is not None:
                    moments.add(term.moments(out, micro), 1.0)
            res.sums.add({k: v for k, v in m.items() if k.endswith("loss")}, 1.0)
            res.sums.add({k: v for k, v in m.items() if not k.endswith("loss")}, share)
            if optim is None:
                continue
            if not torch.isfinite(loss):
                finite = False
                if world == 1:
                    break
            (loss * world).backward()
        if any(t.summary is not None for t in terms):
            total = moments.all_reduce().sums  # the whole mini-batch's, whatever its split over micro-batches and ranks
            for term in terms:
                if term.summary is not None:
                    res.shared.add(term.summary(total), 1.0)
        if optim is not None:
            grad_norm, ok = optim.step(finite)
            res.shared.add({"grad_norm": grad_norm}, 1.0)
            res.skipped += not ok
    return res


# ---- mini-batches and micro-batches -------------------------------------------------------------
def mini_batches(batch: Batch, mini_batch_size: int, epochs: int, shuffle: bool,
                 generator: torch.Generator) -> Iterator[Batch]:
    """`epochs` passes over `batch` in mini-batches, reshuffled each pass with `generator`."""
    for _ in range(epochs):
        order = torch.randperm(len(batch), generator=generator) if shuffle else torch.arange(len(batch))
        for rows in order.split(mini_batch_size):  # one copy per mini-batch, not a shuffled batch then its parts
            yield batch.index(rows.tolist())


def rl_mini_batches(batch: Batch, mini_batch_size: int, epochs: int, shuffle: bool, generator: torch.Generator,
                    micro_batch_size: int, max_tokens: int, device, denominators: Callable[[Batch], Any],
                    by_group: bool = False) -> Iterator[MiniBatch]:
    """The actor's and critic's mini-batches: shuffled with `generator`, this rank's rows of each
    (workers/dp.py) in micro-batches of `micro_batch_size` rows or `max_tokens` real tokens, each
    moved to `device` when it runs. `denominators(mini)` are the global mini-batch's; a micro-batch's
    metric share is its part of the global mini-batch's response tokens. by_group: a mini-batch's
    rows are ordered by `group_ids` (stable) before they are cut into micro-batches, so the rows of
    one prompt share micro-batches (models/shared_prompt.py forwards each distinct prompt of a
    micro-batch once); the sums over a mini-batch are the same rows in another order."""
    for mini in mini_batches(batch, mini_batch_size, epochs, shuffle, generator):
        if by_group and "group_ids" in mini:
            mini = mini.index(torch.sort(mini["group_ids"], stable=True).indices.tolist())
        tokens = max(float(mini["response_mask"].sum()), 1.0)
        mbs, _ = micro_batches(dp.shard(mini), micro_batch_size, max_tokens)
        yield MiniBatch(denominators(mini), _with_shares(mbs, device, tokens))


def _with_shares(mbs: list[Batch], device, tokens: float) -> Iterator[tuple[Batch, float]]:
    for mb in mbs:
        mb = mb.to(device)
        yield mb, float(mb["response_mask"].sum()) / tokens


def chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    """Consecutive slices of `size` items (the last may be shorter): SFT rows, DPO / RM pairs."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


@torch.no_grad()
def map_micro_batches(model, batch: Batch, micro_batch_size: int, max_tokens: int,
                      fn: Callable[[Batch], tuple[torch.Tensor | None, ...]]) -> list[torch.Tensor | None]:
    """`fn(micro-batch on the model's device)` -> per-row tensors (b, ...) or None, over the whole
    batch in eval mode (token budget honoured): each output on the CPU, back in batch order."""
    was_training, device = model.training, next(model.parameters()).device
    model.eval()
    outs: list[list] = []
    mbs, order = micro_batches(batch, micro_batch_size, max_tokens)
    for mb in mbs:
        outs.append([t.cpu() if t is not None else None for t in fn(mb.to(device))])
    model.train(was_training)
    return [restore_order(torch.cat(col), order) if col[0] is not None else None for col in zip(*outs)]
