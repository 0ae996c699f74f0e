"""Versioned weight publications: what the trainer ranks hand to the rollout workers
(trainer.backend=ray, rollout.staleness > 0) after each update. See docs/distributed.md.

A publication is the actor's trainable tensors after `version` completed steps (LoRA: the
adapters only), with a checksum the receiving worker recomputes before loading them: a
truncated or corrupted transfer is refused (`CorruptPublication`), never half-loaded.

Checksum: SHA-256 over, for each tensor in sorted name order, the UTF-8 name, its dtype and
shape as text, then its raw bytes (contiguous, CPU, native little-endian on x86-64). Hashing the
names, dtypes and shapes too means a renamed, reshaped or reordered tensor fails as well.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

import torch


class CorruptPublication(RuntimeError):
    """A publication whose tensors do not match its checksum: the worker refuses to load it."""


def checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 hex digest of `tensors` (see the module docstring for what is hashed, in which order)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class Publication:
    version: int  # completed trainer steps these weights are the result of
    tensors: dict  # {parameter name: CPU tensor}
    digest: str  # checksum(tensors) computed by the publisher

    @classmethod
    def make(cls, version: int, tensors: Mapping[str, torch.Tensor]) -> "Publication":
        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        return cls(int(version), tensors, checksum(tensors))

    def verify(self) -> "Publication":
        """The same publication when its tensors match its checksum; else CorruptPublication."""
        got = checksum(self.tensors)
        if got != self.digest:
            raise CorruptPublication(f"weight publication v{self.version}: checksum {got[:12]} != published "
                                     f"{self.digest[:12]}; refused")
        return self
