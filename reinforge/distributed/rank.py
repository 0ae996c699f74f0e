"""One data-parallel rank: a process (a Ray actor) that joins the torch.distributed group and
holds the same worker objects a local run builds, with their models sharded by FSDP2, plus its
generation engine (engine.py).

The group (group.py) calls `run(role, method, batch)` on every rank at once; each rank runs
the worker method on its input and the collectives inside (FSDP all-gathers, the actor's
all-reduces) meet across ranks.
"""
from __future__ import annotations

import os
import socket
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from reinforge.distributed import fsdp, weights
from reinforge.models import seq_parallel
from reinforge.seeding import seed_everything


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class RankProcess:
    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.workers: dict = {}
        self.models: dict = {}
        self.engine = None

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the group's rendezvous."""
        import ray

        return ray.util.get_node_ip_address(), _free_port()

    def pid(self) -> int:
        return os.getpid()

    def setup(self, plan, builder, make_engine, addr: str, port: int, threads: int = 1) -> None:
        """Join the process group, then build the workers with `builder(plan, shard=...)` and the
        generation engine with `make_engine(plan, sharded_actor, rank, world)` (None: none).

        plan is the driver's resolved RunPlan (trainers/plan.py), given this rank's device; the
        builders come from rl_setup (passed in, because this layer sits below the trainers and
        must not import them)."""
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(0)  # Ray exposes one GPU per rank as device 0
        else:
            torch.set_num_threads(threads)
        # GPU: NCCL for the model's tensors, gloo for the few CPU tensors the workers all-reduce
        # (metric sums, "every rank finite", micro-batch counts).
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.world, timeout=timedelta(minutes=30))
        seq_parallel.init_groups(plan.cfg.trainer.sequence_parallel)  # before the models: shard_model attaches it
        plan = replace(plan, device="cuda" if cuda else "cpu")  # this rank's own plan
        seed_everything(plan.cfg.trainer.seed)  # the same on every rank: identical value-head init, shuffles
        w = builder(plan, shard=fsdp.shard_model)
        self.workers = {"actor": w.actor, "reference": w.reference, "critic": w.critic}
        self.models = {"actor": w.actor_model, "critic": w.critic_model}
        if make_engine is not None:
            self.engine = make_engine(plan, w.actor_model, self.rank, self.world)

    def run(self, role: str, method: str, batch, kwargs: dict):
        out = getattr(self.workers[role], method)(batch, **kwargs)
        return out.to("cpu") if hasattr(out, "to") and not isinstance(out, dict) else out

    def generate(self, prompts, kwargs: dict, seed: int | None, version: int):
        """This rank's share of a rollout (None when it has none); every rank is called, since
        the engine's weight sync (when `version` moved on) is a collective."""
        out = self.engine.generate(self.models["actor"], version, prompts, kwargs, seed)
        return None if out is None else out.to("cpu")

    def publish(self, role: str, version: int):
        """Collective: the trainable weights as a versioned publication for the rollout workers
        (rollout_workers.publish_on_rank) -> its handle on rank 0, None elsewhere."""
        from reinforge.distributed.rollout_workers import publish_on_rank

        return publish_on_rank(self.models[role], version, self.rank)

    def save_sharded(self, role: str, path: str, full_path: str):
        """Collective: this rank's model and optimizer shards go under `path`, and rank 0
        streams the full weights into the safetensors file `full_path` (evaluation, a local
        resume); rank 0 returns the worker's other state (scheduler, shuffling generator, guard)."""
        worker, model = self.workers[role], self.models[role]
        fsdp.save_sharded(model, worker.opt, path)
        weights.write_safetensors(model, full_path, write=self.rank == 0)
        return worker.state_dict(optimizer=False) if self.rank == 0 else None

    def load_sharded(self, role: str, path: str, state: dict) -> None:
        worker, model = self.workers[role], self.models[role]
        fsdp.load_sharded(model, worker.opt, path)
        worker.load_state_dict(state)  # without "optimizer": the shards above restored it

    def state_dict(self, role: str) -> dict:
        """The worker's state besides its weights and optimizer (those are sharded)."""
        return self.workers[role].state_dict(optimizer=False)

    def save_hf(self, role: str, folder: str) -> None:
        """Collective: rank 0 writes a `from_pretrained` folder's weights (LoRA merged) and config."""
        weights.save_hf(self.models[role], folder, write=self.rank == 0)
