"""The batch container that flows between workers: tensors sharing a batch dimension,
per-sample Python objects (ground truths, data source), and free-form meta.

A deliberately small cousin of veRL's DataProto. Every worker takes a `Batch` and returns a
`Batch` of new fields; the trainer merges them with `|` (union). Shapes follow the conventions
in docs/architecture.md: B sequences, P prompt length, T response length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Tensors whose first dimension is the batch dimension B."""
    non_tensors: dict[str, list] = field(default_factory=dict)
    """Per-sample Python values, each a list of length B."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Batch-level information (e.g. temperature used); not split, merged by union."""

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.non_tensors.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the batch size: {sizes}")
        self.non_tensors = {k: list(v) for k, v in self.non_tensors.items()}

    # ---- basic access -------------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.tensors.values():
            return v.shape[0]
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def keys(self) -> list[str]:
        return list(self.tensors) + list(self.non_tensors)

    def __getitem__(self, key):
        """`batch["name"]` returns a field; an int, slice or index tensor returns a sub-batch."""
        if isinstance(key, str):
            if key in self.tensors:
                return self.tensors[key]
            if key in self.non_tensors:
                return self.non_tensors[key]
            raise KeyError(f"{key!r} not in batch; fields: {sorted(self.keys())}")
        if isinstance(key, int):
            key = slice(key, key + 1 if key != -1 else None)
        if isinstance(key, slice):
            idx = list(range(len(self)))[key]
        else:
            idx = torch.as_tensor(key).reshape(-1).tolist()
        return self.index(idx)

    def __setitem__(self, key: str, value) -> None:
        n = len(self)
        size = value.shape[0] if isinstance(value, torch.Tensor) else len(value)
        if self.keys() and size != n:
            raise ValueError(f"field {key!r} has batch size {size}, batch has {n}")
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            self.non_tensors[key] = list(value)

    def index(self, idx: Sequence[int]) -> "Batch":
        """Rows `idx` in that order (gather)."""
        t = torch.as_tensor(list(idx), dtype=torch.long)
        return Batch(
            {k: v[t.to(v.device)] for k, v in self.tensors.items()},
            {k: [v[i] for i in idx] for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    # ---- combining ----------------------------------------------------------------------
    def union(self, other: "Batch") -> "Batch":
        """Merge fields of two batches of the same size. Shared keys must hold equal values."""
        if len(self.keys()) and len(other.keys()) and len(self) != len(other):
            raise ValueError(f"union of batches of size {len(self)} and {len(other)}")
        tensors = dict(self.tensors)
        for k, v in other.tensors.items():
            if k in tensors and not (tensors[k].shape == v.shape and torch.equal(tensors[k], v)):
                raise ValueError(f"union: field {k!r} differs between the two batches")
            tensors[k] = v
        non_tensors = dict(self.non_tensors)
        for k, v in other.non_tensors.items():
            if k in non_tensors and non_tensors[k] != v:
                raise ValueError(f"union: field {k!r} differs between the two batches")
            non_tensors[k] = v
        return Batch(tensors, non_tensors, {**self.meta, **other.meta})

    __or__ = union

    def select(self, keys: Iterable[str]) -> "Batch":
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"select: {missing} not in batch; fields: {sorted(self.keys())}")
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensors.items() if k in keys},
            dict(self.meta),
        )

    def pop(self, keys: Iterable[str]) -> "Batch":
        """Remove `keys` from this batch and return them as a new batch."""
        out = self.select(keys)
        for k in out.keys():
            self.tensors.pop(k, None)
            self.non_tensors.pop(k, None)
        return out

    def split(self, size: int) -> list["Batch"]:
        """Consecutive sub-batches of `size` rows (the last may be smaller)."""
        if size <= 0:
            raise ValueError(f"split size must be positive, got {size}")
        return [self.index(range(i, min(i + size, len(self)))) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list["Batch"]:
        """`n` near-equal consecutive parts (sizes differ by at most one; none empty)."""
        if n <= 0 or n > max(len(self), 1):
            raise ValueError(f"cannot chunk a batch of {len(self)} into {n} parts")
        base, extra = divmod(len(self), n)
        out, start = [], 0
        for i in range(n):
            size = base + (1 if i < extra else 0)
            out.append(self.index(range(start, start + size)))
            start += size
        return out

    @staticmethod
    def concat(batches: Sequence["Batch"]) -> "Batch":
        if not batches:
            return Batch()
        keys = set(batches[0].keys())
        for b in batches[1:]:
            if set(b.keys()) != keys:
                raise ValueError(f"concat: field sets differ: {sorted(keys ^ set(b.keys()))}")
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in batches[0].tensors}
        non_tensors = {k: sum((b.non_tensors[k] for b in batches), []) for k in batches[0].non_tensors}
        return Batch(tensors, non_tensors, dict(batches[0].meta))

    def repeat(self, n: int) -> "Batch":
        """Each row repeated `n` times in place: [a, b] -> [a, a, b, b] (interleaved)."""
        idx = [i for i in range(len(self)) for _ in range(n)]
        return self.index(idx)

    def to(self, device) -> "Batch":
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.non_tensors), dict(self.meta))

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.tensors.items()}
        return f"Batch(B={len(self)}, tensors={shapes}, non_tensors={list(self.non_tensors)})"
