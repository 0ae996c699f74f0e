"""The roles the RL trainer trains (actor, critic) or only reads (reference, teacher): one
protocol each, implemented alike by the local workers (actor.py, critic.py, reference.py) and
by the Ray proxies (distributed/proxies.py), so the trainer never asks which kind it holds.

A trained role saves itself into a checkpoint's temporary folder (the trainer makes the folder
atomic, trainers/checkpoint.py) and returns the state the trainer stores for it in
`trainer_state.pt`; `load` takes both back. What lands on disk, per role `<name>`:

- local: `<name>.safetensors` (the full weights) and, in the returned state, the optimizer,
  scheduler, shuffling generator and non-finite guard (`TrainedWorkerState.state_dict`);
- Ray: `<name>_sharded/` (each rank's model and optimizer shards) and `<name>.safetensors`
  streamed by rank 0 beside them; the returned state lacks the optimizer (it is in the shards).

A checkpoint of one kind does not resume into the other kind's optimizer: `load` says so.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from safetensors.torch import load_model, save_model

from reinforge.config.load import ConfigError
from reinforge.models.lora import save_merged
from reinforge.protocol import Batch
from reinforge.workers.optim import TrainedWorkerState


class FrozenRole(Protocol):
    """A model the trainer reads but does not train: the reference policy, the distillation teacher."""

    def log_probs(self, batch: Batch) -> Batch:
        """-> ref_log_probs (B, T) of the batch's responses."""

    def close(self) -> None:
        """Release what the role holds outside this process (a Ray worker group)."""


class TrainedRole(Protocol):
    """A model the trainer updates and checkpoints: the actor or the critic."""

    def update(self, batch: Batch) -> dict[str, float]:
        """One training pass over the batch; returns `<role>/...` metrics."""

    def state_dict(self) -> dict:
        """The role's training state besides its weights (scheduler, shuffling generator, guard;
        the optimizer where this process holds it)."""

    def save(self, ckpt_dir: Path) -> dict:
        """Write this role's files into the checkpoint folder `ckpt_dir` (still temporary);
        returns the state to keep in the trainer state (picklable)."""

    def load(self, ckpt_dir: Path, state: dict | None) -> None:
        """Restore what `save` wrote into `ckpt_dir` and returned as `state` (None: the
        checkpoint holds no state for this role). Raises ConfigError for a checkpoint of the
        other backend's kind."""

    def export(self, folder: Path, tokenizer) -> None:
        """Write a `from_pretrained` folder of this role's model (LoRA merged) and `tokenizer`."""

    def close(self) -> None:
        """Release what the role holds outside this process (a Ray worker group)."""


class ActorRole(TrainedRole, Protocol):
    def log_probs(self, batch: Batch, *, with_entropy: bool = True, with_sum_pi_squared: bool = False) -> Batch:
        """-> old_log_probs (B, T), optionally entropy (B, T) and sum_pi_squared (B, T)."""


class CriticRole(TrainedRole, Protocol):
    def values(self, batch: Batch) -> Batch:
        """-> values (B, T)."""


def local_sharded_error(ckpt_dir: Path, role: str) -> ConfigError:
    return ConfigError(f"{ckpt_dir} holds the {role}'s optimizer sharded over a Ray worker group; "
                       f"resume it with trainer.backend=ray (any number of ranks)")


def ray_unsharded_error(ckpt_dir: Path, role: str) -> ConfigError:
    return ConfigError(f"{ckpt_dir} was written by a local run; its {role} optimizer state cannot "
                       f"be loaded into a Ray worker group (start from its weights instead)")


class LocalTrainedRole(TrainedWorkerState):
    """The TrainedRole methods of a worker in this process whose `model` it trains, with its
    `opt`, `sched`, `gen` and `guard` (TrainedWorkerState). A subclass names its role:
    `class ActorWorker(LocalTrainedRole, role="actor")`, the stem of its checkpoint files."""

    role = ""

    def __init_subclass__(cls, role: str = "", **kwargs):
        super().__init_subclass__(**kwargs)
        if role:
            cls.role = role

    def save(self, ckpt_dir: Path) -> dict:
        save_model(self.model, str(Path(ckpt_dir) / f"{self.role}.safetensors"))  # handles tied embeddings
        return self.state_dict()

    def load(self, ckpt_dir: Path, state: dict | None) -> None:
        ckpt_dir = Path(ckpt_dir)
        weights = ckpt_dir / f"{self.role}.safetensors"
        if not weights.exists():
            raise FileNotFoundError(f"checkpoint {ckpt_dir} has no weights for {self.role!r}")
        load_model(self.model, str(weights), strict=True)
        if state is None:
            return
        if (ckpt_dir / f"{self.role}_sharded").exists():
            raise local_sharded_error(ckpt_dir, self.role)
        self.load_state_dict(state)

    def export(self, folder: Path, tokenizer) -> None:
        save_merged(self.model, folder)
        tokenizer.save_pretrained(folder)

    def close(self) -> None:
        """Nothing to release: the model lives and dies with this process."""
