"""trainer.backend=ray with a mixture-of-experts policy (2 CPU ranks, gloo, FSDP2; a tiny
Qwen3-MoE): a GRPO run generates on the ranks, trains the experts and the routers with the
load-balancing loss on and logs the expert-load metrics. Routing replay is local-only (refused
on Ray by config/validate.check_router_replay, tests/test_bad_inputs.py)."""
from __future__ import annotations

import math

import pytest
import torch

ray = pytest.importorskip("ray")

from reinforge.config.load import load_config  # noqa: E402
from reinforge.config.schema import RLConfig  # noqa: E402
from tests.conftest import rl_overrides  # noqa: E402


@pytest.mark.slow
def test_grpo_moe_on_two_ranks(ray_cluster, arith_data, tmp_path):
    from safetensors.torch import load_file

    from reinforge.models.tiny import make_tiny_moe_model
    from reinforge.tasks import build_char_tokenizer
    from reinforge.trainers.rl import RLTrainer

    model = tmp_path / "moe"
    base = make_tiny_moe_model(build_char_tokenizer(), str(model), seed=0, hidden_size=64, expert_size=32)
    run = tmp_path / "run"
    extra = {"trainer.backend": "ray", "trainer.devices_per_node": 2, "trainer.val_before_train": False,
             "trainer.save_every": 1, "trainer.total_steps": 1, "actor.router_aux_loss_coef": 0.01,
             "actor.use_kl_loss": True}
    last = RLTrainer(load_config(RLConfig, "grpo", rl_overrides(str(model), arith_data, str(run), **extra))).fit()
    assert math.isfinite(last["actor/pg_loss"]) and last["actor/grad_norm"] > 0
    assert last["actor/moe_aux_loss"] >= 1.0 and 1 / 8 <= last["actor/moe_load_max"] <= 1 / 2
    step = load_file(str(run / "checkpoints" / "step_1" / "actor.safetensors"))
    init = base.state_dict()
    for part in ("experts.gate_up_proj", "mlp.gate.weight"):  # the experts and the routers trained
        names = [k for k in step if part in k]
        assert names and any(not torch.equal(step[k], init[k]) for k in names), part
