"""trainer.backend=ray with rollout.backend=vllm on the CPU build: each rank builds its engine in
its own process (vLLM's external launcher over the rank's gloo group), awake (no sleep mode on
the CPU platform), and takes its weights from the rank's FSDP2 shards after every update."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytest.importorskip("ray")
pytestmark = pytest.mark.vllm

from tests.vllm_real.test_train import VLLM  # noqa: E402


@pytest.mark.parametrize("ranks", [2])  # 1 rank passes too (run once; left out for time)
def test_grpo_on_ray_ranks_with_their_vllm_engines(ranks, ray_cluster, vllm_model_dir, arith_data, tmp_path):
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer
    from tests.conftest import rl_overrides

    run = tmp_path / "ray"
    extra = {**VLLM, "trainer.backend": "ray", "trainer.devices_per_node": ranks, "trainer.val_before_train": False}
    RLTrainer(load_config(RLConfig, "grpo", rl_overrides(vllm_model_dir, arith_data, str(run), **extra))).fit()
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["step"] > 0]
    assert len(steps) == 2
    for s in steps:  # the rank's engine samples from the weights its shards hold, step 2 after an update
        assert s["rollout_corr/logprob_gap_max"] < 1e-4, s["rollout_corr/logprob_gap_max"]
