"""Stand-ins for the actor, critic, reference and rollout that forward to a RayWorkerGroup.

They implement the same roles as the local workers (workers/role.py: ActorRole, CriticRole,
FrozenRole), so the trainer's step, checkpoints, export and close are the same for both backends:
inference methods split the batch over ranks (equal counts, balanced tokens) and gather the
results in the batch's order; updates send the whole batch to every rank (each trains on its
slice of every mini-batch, see workers/dp.py) and return rank 0's metrics, already summed
over ranks; generation runs on the ranks (RankRollout).

The driver holds no weights: checkpoints, the HF export and the unsharded `actor.safetensors`
are written by the ranks, streamed from their shards (weights.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

from reinforge.protocol import Batch
from reinforge.workers.role import ray_unsharded_error


class _RayTrainedRole:
    """The TrainedRole of workers/role.py for a role that lives on the ranks."""

    role = ""

    def __init__(self, group):
        self.group = group
        self.version = 0  # bumped whenever the ranks' weights change (update, resume)

    def update(self, batch: Batch) -> dict[str, float]:
        self.version += 1
        return self.group.run_same(self.role, "update", batch)[0]

    def state_dict(self) -> dict:
        """Rank 0's state without the optimizer, which only exists as the ranks' shards."""
        return self.group.run_all(self.role, "state_dict")[0]

    def save(self, ckpt_dir: Path) -> dict:
        """Each rank writes its model and optimizer shards under `<role>_sharded/`, and rank 0
        the full weights beside it (`<role>.safetensors`, one tensor gathered at a time);
        returns the rest of the worker state."""
        ckpt_dir = Path(ckpt_dir)
        return self.group.run_all(self.role, "save_sharded", str(ckpt_dir / f"{self.role}_sharded"),
                                  str(ckpt_dir / f"{self.role}.safetensors"))[0]

    def load(self, ckpt_dir: Path, state: dict | None) -> None:
        if state is None:
            return
        sharded = Path(ckpt_dir) / f"{self.role}_sharded"
        if not sharded.exists():
            raise ray_unsharded_error(ckpt_dir, self.role)
        self.group.run_all(self.role, "load_sharded", str(sharded), state)
        self.version += 1  # the engines re-read what the ranks loaded

    def export(self, folder: Path, tokenizer) -> None:
        """Rank 0 writes a `from_pretrained` folder's weights (LoRA merged) and config into
        `folder`; the tokenizer is written here."""
        self.group.run_all(self.role, "save_hf", str(folder))
        tokenizer.save_pretrained(folder)

    def close(self) -> None:
        """Stop the ranks now, not at exit. The group is shared by every proxy of the run, so
        this ends them all (the trainer closes them together); a second close does nothing."""
        self.group.shutdown()


class ActorProxy(_RayTrainedRole):
    role = "actor"

    def log_probs(self, batch: Batch, *, with_entropy: bool = True, with_sum_pi_squared: bool = False) -> Batch:
        return self.group.run_split("actor", "log_probs", batch, with_entropy=with_entropy,
                                    with_sum_pi_squared=with_sum_pi_squared)


class CriticProxy(_RayTrainedRole):
    role = "critic"

    def values(self, batch: Batch) -> Batch:
        return self.group.run_split("critic", "values", batch)


class ReferenceProxy:
    def __init__(self, group):
        self.group = group

    def log_probs(self, batch: Batch) -> Batch:
        return self.group.run_split("reference", "log_probs", batch)

    def close(self) -> None:
        self.group.shutdown()


class RankRollout:
    """The rollout of a Ray run: each rank generates its share with its own engine, whose
    weights follow the actor's version (synced inside the ranks before generating).

    A sampled call draws one seed from the driver's torch RNG (so it follows the training
    stream, checkpointed and resumed with it; validation runs under fork_rng) and each prompt
    samples from prompt_seed(seed, uid) on whichever rank gets it."""

    def __init__(self, group, actor: ActorProxy):
        self.group, self.actor = group, actor

    def generate(self, prompts: Batch, *, n: int, temperature: float = 1.0, greedy: bool = False) -> Batch:
        from reinforge.workers.rollout.vlm import own_vision

        seed = None if greedy else int(torch.randint(0, 2**62, (1,)))
        kwargs = {"n": n, "temperature": temperature, "greedy": greedy}
        return own_vision(prompts, self.group.generate(prompts, kwargs, seed, self.actor.version))

    def sync_weights(self, actor_model) -> None:
        """Nothing here: a rank syncs its engine when the actor's version has moved on."""
