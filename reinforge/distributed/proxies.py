"""Stand-ins for the actor, critic, reference and rollout that forward to a RayWorkerGroup.

They keep the local workers' interface, so the trainer's step is the same for both backends:
inference methods split the batch over ranks (equal counts, balanced tokens) and gather the
results in the batch's order; updates send the whole batch to every rank (each trains on its
slice of every mini-batch, see workers/dp.py) and return rank 0's metrics, already summed
over ranks.

The driver keeps an unsharded copy of each trained model (`driver_model`): generation with
the HF rollout runs on it, checkpoints and the HF export read it. It is refreshed from the
ranks after every update (rollout.sync_weights) and before every checkpoint (save_sharded),
gathering the full weights only when an update happened since the last refresh.
"""
from __future__ import annotations

from reinforge.protocol import Batch


def _load(driver_model, weights: dict) -> None:
    missing, unexpected = driver_model.load_state_dict(weights, strict=False)
    # Tied embeddings are stored once; anything else missing is a real mismatch.
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"weights from the worker group do not match the driver model: "
                           f"missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}")


class _TrainedRole:
    role = ""

    def __init__(self, group, driver_model):
        self.group, self.driver_model = group, driver_model
        self.driver_current = True  # the driver copy equals the ranks' weights (no update since)

    def update(self, batch: Batch) -> dict[str, float]:
        self.driver_current = False
        return self.group.run_same(self.role, "update", batch)[0]

    def pull_weights(self) -> None:
        """Refresh the driver's unsharded copy from the ranks (a full gather: only when stale)."""
        if not self.driver_current:
            _load(self.driver_model, self.group.run_all(self.role, "pull_weights")[0])
            self.driver_current = True

    def save_sharded(self, path) -> dict:
        """Each rank writes its model and optimizer shards under `path`; returns the rest of the
        worker state, with the driver model current (the checkpoint's unsharded weights)."""
        state = self.group.run_all(self.role, "save_sharded", str(path))[0]
        self.pull_weights()
        return state

    def load_sharded(self, path, state: dict) -> None:
        self.group.run_all(self.role, "load_sharded", str(path), state)
        self.driver_current = False  # the next sync re-reads what the ranks loaded


class ActorProxy(_TrainedRole):
    role = "actor"

    def log_probs(self, batch: Batch, *, with_entropy: bool = True, with_sum_pi_squared: bool = False) -> Batch:
        return self.group.run_split("actor", "log_probs", batch, with_entropy=with_entropy,
                                    with_sum_pi_squared=with_sum_pi_squared)


class CriticProxy(_TrainedRole):
    role = "critic"

    def values(self, batch: Batch) -> Batch:
        return self.group.run_split("critic", "values", batch)


class ReferenceProxy:
    def __init__(self, group):
        self.group = group

    def log_probs(self, batch: Batch) -> Batch:
        return self.group.run_split("reference", "log_probs", batch)


class SyncedRollout:
    """The driver's rollout; `sync_weights` brings the actor proxy's driver copy (the model the
    rollout generates with) up to date with the ranks first."""

    def __init__(self, rollout, actor: ActorProxy):
        self.inner, self.actor = rollout, actor

    def generate(self, prompts: Batch, **kwargs) -> Batch:
        return self.inner.generate(prompts, **kwargs)

    def sync_weights(self, actor_model) -> None:
        self.actor.pull_weights()
        self.inner.sync_weights(actor_model)

    def __getattr__(self, name):
        return getattr(self.inner, name)
