"""GRPO and PPO through the CLI with rollout.backend=vllm on the real CPU engine: the config
accepts it on trainer.device=cpu (vLLM's platform says CPU), two steps run, and after the first
update the engine's log-probs are still the trainer's (the weight sync after a real update)."""
from __future__ import annotations

import gc
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

VLLM = {"rollout.backend": "vllm", "rollout.enforce_eager": True, "rollout.cpu_kv_cache_gb": 0.25,
        "trainer.device": "cpu"}


def _steps(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] > 0]


@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_train_with_vllm(preset, vllm_model_dir, arith_data, tmp_path):
    from reinforge.cli.main import main
    from tests.conftest import rl_overrides

    gc.collect()  # one engine at a time in the process (tests/vllm_real/conftest.py)
    run = tmp_path / preset
    assert main(["train", "--config", preset, *rl_overrides(vllm_model_dir, arith_data, str(run), **VLLM)]) == 0
    steps = _steps(run)
    assert len(steps) == 2
    for s in steps:  # fp32: the engine samples from the weights the trainer scores, step 2 after an update
        assert s["rollout_corr/logprob_gap_max"] < 1e-4, s["rollout_corr/logprob_gap_max"]
        assert math.isfinite(s["actor/pg_loss"])
    assert math.isfinite(steps[-1]["val/acc_greedy"]) and math.isfinite(steps[-1]["val/pass@2"])
    print(preset, {k: steps[-1][k] for k in ("rollout_corr/logprob_gap_max", "timing_s/gen", "timing_s/step")
                   if k in steps[-1]})
    assert (run / "checkpoints" / "step_2" / "COMPLETE").exists()
    gc.collect()  # the run's engine shut down before the next is built
