"""The trained-role protocol (workers/role.py) on both backends, without a model load or a Ray
cluster: a local role round-trips its checkpoint files and refuses a Ray checkpoint's optimizer;
the Ray proxy sends the same calls to its group and refuses a local checkpoint's; TrainerState
reads and writes the dict trainer_state.pt has always held."""
from __future__ import annotations

import pytest
import torch

from reinforge.config.load import ConfigError
from reinforge.distributed.proxies import ActorProxy, CriticProxy, ReferenceProxy
from reinforge.trainers.state import TrainerState
from reinforge.workers.optim import make_optimizer, make_scheduler
from reinforge.workers.update_loop import NonFiniteGuard
from reinforge.workers.role import LocalTrainedRole


class TinyRole(LocalTrainedRole, role="critic"):
    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(3, 2)
        self.opt = make_optimizer(self.model.parameters(), 1e-2, 0.0)
        self.sched = make_scheduler(self.opt, 2, 10)
        self.gen = torch.Generator().manual_seed(seed)
        self.guard = NonFiniteGuard(3, "critic")

    def step(self) -> None:
        self.model(torch.ones(1, 3)).sum().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        torch.randperm(5, generator=self.gen)


def test_local_role_round_trips_its_checkpoint(tmp_path):
    a = TinyRole(0)
    a.step()
    state = a.save(tmp_path)
    assert (tmp_path / "critic.safetensors").exists() and "optimizer" in state
    b = TinyRole(1)
    b.load(tmp_path, state)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    a.step()
    b.step()  # the same optimizer moments, schedule and shuffling stream
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert torch.equal(a.gen.get_state(), b.gen.get_state())


def test_local_role_refuses_a_ray_checkpoint(tmp_path):
    a = TinyRole(0)
    state = a.save(tmp_path)
    (tmp_path / "critic_sharded").mkdir()
    with pytest.raises(ConfigError, match="optimizer sharded over a Ray worker group; resume it with trainer.backend=ray"):
        a.load(tmp_path, state)
    (tmp_path / "critic.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no weights for 'critic'"):
        a.load(tmp_path, state)


class FakeGroup:
    def __init__(self):
        self.calls, self.ranks = [], [0, 1]

    def run_all(self, role, method, *args):
        self.calls.append((role, method, *args))
        return [{"scheduler": "s"}, None]

    def shutdown(self):
        self.calls.append(("shutdown",))
        self.ranks = []


class FakeTokenizer:
    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


def test_ray_role_calls_its_ranks(tmp_path):
    group = FakeGroup()
    actor, critic = ActorProxy(group), CriticProxy(group)
    assert actor.save(tmp_path) == {"scheduler": "s"}
    assert group.calls[-1] == ("actor", "save_sharded", str(tmp_path / "actor_sharded"),
                               str(tmp_path / "actor.safetensors"))
    with pytest.raises(ConfigError, match="was written by a local run; its critic optimizer state cannot"):
        critic.load(tmp_path, {"scheduler": "s"})
    (tmp_path / "actor_sharded").mkdir()
    actor.load(tmp_path, {"scheduler": "s"})
    assert group.calls[-1] == ("actor", "load_sharded", str(tmp_path / "actor_sharded"), {"scheduler": "s"})
    assert actor.version == 1  # the engines re-read the loaded weights
    actor.export(tmp_path, FakeTokenizer())
    assert group.calls[-1] == ("actor", "save_hf", str(tmp_path)) and (tmp_path / "tokenizer.json").exists()
    for role in (ReferenceProxy(group), critic, actor):
        role.close()
    assert group.ranks == [] and group.calls.count(("shutdown",)) == 3


def test_trainer_state_reads_and_writes_the_old_dict():
    old = {"step": 3, "next_uid": 12, "rng": {"torch": None}, "loader": {"epoch": 1}, "actor": {"a": 1},
           "critic": None, "kl_ctrl": None}
    state = TrainerState.from_dict(old)
    assert state.roles == {"actor": {"a": 1}, "critic": None} and state.async_offset is None
    assert state.to_dict() == old
    state.async_offset = 2
    assert TrainerState.from_dict(state.to_dict()).async_offset == 2
