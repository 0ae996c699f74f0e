"""Optimizer, LR schedule and the checkpoint state of a trained worker (the update loop itself,
its optimizer step and non-finite guard: workers/update_loop.py)."""
from __future__ import annotations

import math

import torch


def make_optimizer(params, lr: float, weight_decay: float, betas=(0.9, 0.999), *,
                   fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW over the trainable `params`. fused: torch's fused kernel (one pass per tensor, no
    temporaries: the per-tensor loop allocates two tensors the size of each parameter, 0.5 GB
    each for a 152k x 896 fp32 embedding); None: fused for models of >= 100M parameters
    (models/shape_defaults.py), so small models keep the per-tensor loop's numerics. Both keep
    the update order fixed (no foreach), so a resumed run reproduces bit for bit."""
    from reinforge.models.shape_defaults import large

    params = [p for p in params if p.requires_grad]
    if fused is None:
        fused = large(sum(p.numel() for p in params))
    kw = {"fused": True} if fused else {"foreach": False}
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas), **kw)


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
