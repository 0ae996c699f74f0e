"""What an RL checkpoint holds besides the files its roles write: `trainer_state.pt`.

On disk it stays the plain dict earlier versions wrote and read (`to_dict` / `from_dict`), so
checkpoints of either age load into the other: keys step, next_uid, rng, loader, actor,
critic, kl_ctrl, and async_offset (only when rollout.staleness > 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("actor", "critic")  # the trained roles, each one key of the dict


@dataclass
class TrainerState:
    step: int
    """Steps completed when the checkpoint was written."""
    next_uid: int
    """The uid of the next prompt drawn (group ids stay unique across a resume)."""
    rng: dict
    """torch / python / numpy (/ cuda) generator states (checkpoint.rng_state)."""
    loader: dict
    """The prompt loader's position (PromptLoader.state_dict)."""
    roles: dict[str, dict | None] = field(default_factory=lambda: dict.fromkeys(ROLES))
    """{role: what its TrainedRole.save returned}; None for a role the run does not have."""
    kl_ctrl: dict | None = None
    """The adaptive KL controller's state; None without one."""
    async_offset: int | None = None
    """rollout.staleness > 0: the offset of the first untrained prompt in its loader round
    (async_rollout.Start); None for a synchronous run."""

    def to_dict(self) -> dict:
        d = {"step": self.step, "next_uid": self.next_uid, "rng": self.rng, "loader": self.loader,
             **{name: self.roles.get(name) for name in ROLES}, "kl_ctrl": self.kl_ctrl}
        if self.async_offset is not None:
            d["async_offset"] = self.async_offset
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainerState:
        return cls(step=d["step"], next_uid=d["next_uid"], rng=d["rng"], loader=d["loader"],
                   roles={name: d.get(name) for name in ROLES}, kl_ctrl=d.get("kl_ctrl"),
                   async_offset=d.get("async_offset"))
