"""How a weight publication (publication.py) travels from the trainer rank that builds it to
the rollout workers: one small interface, so that the CPU path (Ray's object store) and a GPU
path (not implemented here, see docs/distributed.md) are interchangeable.

    handle = transport.send(publication)        # on the publishing rank (rank 0)
    pub = transport.fetch(handle, timeout_s)    # on a rollout worker; TransferTimeout if late

A handle is small and picklable (it goes through the driver); the tensors do not.
"""
from __future__ import annotations

from typing import Any, Protocol

from reinforge.distributed.publication import Publication


class TransferTimeout(TimeoutError):
    """A publication did not arrive within trainer.weight_sync_timeout_s: abandoned (retried later)."""


class Transport(Protocol):
    def send(self, pub: Publication) -> Any:
        """Make `pub` available to the receivers -> a small picklable handle."""
        ...

    def fetch(self, handle: Any, timeout_s: float) -> Publication:
        """The publication behind `handle` (not yet verified); TransferTimeout after timeout_s."""
        ...


class ObjectStoreTransport:
    """CPU: the publication is put once into Ray's object store by the publishing rank (which
    then owns it); each worker reads it from there (shared memory on the same node, copied
    between nodes by Ray). The handle is [ObjectRef]: a ref inside a list stays a ref when it
    crosses a remote call, instead of being resolved by Ray on the way."""

    def send(self, pub: Publication) -> list:
        import ray

        return [ray.put(pub)]

    def fetch(self, handle: list, timeout_s: float) -> Publication:
        import ray

        try:
            return ray.get(handle[0], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TransferTimeout(f"weight publication not received within {timeout_s:g} s "
                                  f"(trainer.weight_sync_timeout_s)") from None
