"""Optimizer, LR schedule and the mini-batch / micro-batch iteration that actor and critic share."""
from __future__ import annotations

import math
from typing import Iterator

import torch

from reinforge.protocol import Batch


def make_optimizer(params, lr: float, weight_decay: float, betas=(0.9, 0.999)) -> torch.optim.AdamW:
    # foreach=False keeps the update order fixed, so a resumed run reproduces bit for bit.
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, weight_decay=weight_decay,
                             betas=tuple(betas), foreach=False)


def make_scheduler(opt: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                   schedule: str = "constant") -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup for `warmup_steps`, then constant, cosine or linear decay to 0 at `total_steps`."""
    if schedule not in ("constant", "cosine", "linear"):
        raise ValueError(f"lr_schedule={schedule!r} is not known; valid: ['constant', 'cosine', 'linear']")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def mini_batches(batch: Batch, mini_batch_size: int, epochs: int, shuffle: bool,
                 generator: torch.Generator) -> Iterator[Batch]:
    """`epochs` passes over `batch` in mini-batches, reshuffled each pass with `generator`."""
    for _ in range(epochs):
        order = torch.randperm(len(batch), generator=generator) if shuffle else torch.arange(len(batch))
        for rows in order.split(mini_batch_size):  # one copy per mini-batch, not a shuffled batch then its parts
            yield batch.index(rows.tolist())


def clip_and_step(params, opt, grad_clip: float) -> tuple[torch.Tensor, bool]:
    """Clip the global grad norm and step, unless the gradient is not finite (then skip)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    ok = bool(torch.isfinite(grad_norm))
    if ok:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return grad_norm.detach(), ok


class NonFiniteGuard:
    """Counts consecutive skipped updates and aborts the run after `limit` in a row."""

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


class TrainedWorkerState:
    """Checkpoint state of a worker that trains (actor, critic): its `opt`, `sched`, shuffling
    `gen` and non-finite `guard`."""

    def state_dict(self, optimizer: bool = True) -> dict:
        """Optimizer (unless `optimizer=False`: FSDP ranks save theirs sharded), scheduler,
        shuffling generator and guard."""
        return {**({"optimizer": self.opt.state_dict()} if optimizer else {}), "scheduler": self.sched.state_dict(),
                "generator": self.gen.get_state(), "guard": (self.guard.in_a_row, self.guard.total)}

    def load_state_dict(self, state: dict) -> None:
        if "optimizer" in state:  # absent when the ranks restored their optimizer shards themselves
            self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.gen.set_state(state["generator"])
        if "guard" in state:  # (older checkpoints did not save the critic's)
            self.guard.in_a_row, self.guard.total = state["guard"]
