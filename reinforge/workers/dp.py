"""Data parallelism as the workers see it: this rank's rows and the few collectives the update needs.

Workers never start a process group. `reinforge.distributed` starts one (gloo on CPU, nccl on
GPU) in each Ray actor before building the workers; in a local run none exists and every
function here is the single-process identity, so the same worker code serves both.

Why the update shards *inside* the mini-batch loop: every rank receives the whole batch,
shuffles it with the same seeded generator and takes its slice of each mini-batch. The global
mini-batch is then exactly the one a single process would use, so N ranks reproduce 1 rank's
update (not just in expectation), and the counts agg_loss divides by are the global ones.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from reinforge.protocol import Batch


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if _active() else 1


def rank() -> int:
    return dist.get_rank() if _active() else 0


def sp_size() -> int:
    """Ranks per sequence-parallel group (`trainer.sequence_parallel`, models/seq_parallel.py): they
    hold the same rows, each a slice of every row's positions. 1: none."""
    from reinforge.models import seq_parallel

    return seq_parallel.size()


def shard(batch: Batch) -> Batch:
    """This rank's rows of `batch` (the whole batch on one process): equal counts, balanced
    tokens. Every rank computes the same partition from the same data, so the shards are disjoint.
    Under sequence parallelism the shards are per group: its k ranks get the same rows."""
    from reinforge.models.packing import equal_count_partition

    k = sp_size()
    n = world_size() // k
    if n == 1:
        return batch
    return batch.index(equal_count_partition(batch["attention_mask"].sum(-1).tolist(), n)[rank() // k])


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks (identity on one process). Returns `t`."""
    if _active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_true(flag: bool) -> bool:
    """True only when `flag` holds on every rank, so all ranks take the same branch (a rank that
    skipped a collective the others run would hang the group)."""
    if not _active():
        return flag
    t = torch.tensor([0 if flag else 1], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t) == 0
