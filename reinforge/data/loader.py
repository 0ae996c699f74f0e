"""An endless, resumable prompt loader: the same (seed, epoch) gives the same batches."""

from __future__ import annotations

import random
from typing import Any


class PromptLoader:
    """Yields batches (lists of dataset items) forever, reshuffling each epoch.

    The order of epoch e is a permutation drawn from Random(f"{seed}:{e}"), so it does not
    depend on how many batches were drawn before: `state_dict()` taken mid-epoch and loaded
    into a fresh loader continues with exactly the batches an uninterrupted run would see.
    With drop_last=True the last partial batch of each epoch is dropped (every batch has
    exactly `batch_size` items, which fixed-size rollout groups need).
    """

    def __init__(self, dataset, batch_size: int, seed: int, drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and len(dataset) < batch_size:
            raise ValueError(f"dataset has {len(dataset)} items, fewer than batch_size={batch_size} (drop_last=True)")
        if len(dataset) == 0:
            raise ValueError("dataset is empty")
        self.dataset, self.batch_size, self.seed, self.drop_last = dataset, batch_size, seed, drop_last
        self.epoch, self.position = 0, 0  # position: items of this epoch already served
        self._order: list[int] | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            self._order = list(range(len(self.dataset)))
            # A string seed is hashed with SHA-512 by `random`: identical in every process.
            random.Random(f"{self.seed}:{self.epoch}").shuffle(self._order)
        return self._order

    def __iter__(self) -> "PromptLoader":
        return self

    def __next__(self) -> list[dict]:
        n = len(self.dataset)
        remaining = n - self.position
        if remaining == 0 or (self.drop_last and remaining < self.batch_size):
            self.epoch, self.position, self._order = self.epoch + 1, 0, None
        order = self._epoch_order()
        idx = order[self.position : self.position + self.batch_size]
        self.position += len(idx)
        return [self.dataset[i] for i in idx]

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch, "position": self.position, "seed": self.seed,
            "batch_size": self.batch_size, "num_items": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume; refuses a state from a different dataset size, seed or batch size."""
        for key, mine in (("seed", self.seed), ("batch_size", self.batch_size), ("num_items", len(self.dataset))):
            if key in state and state[key] != mine:
                raise ValueError(f"loader state has {key}={state[key]} but this loader has {key}={mine}; "
                                 "resuming would change the batches")
        self.epoch, self.position, self._order = int(state["epoch"]), int(state["position"]), None
