"""What claims vLLM but cannot run on it is refused at config time, with vLLM installed (the CPU
build), before any model loads: a clear one-line reason naming the key."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

from tests.vllm_real.test_train import VLLM  # noqa: E402


def _plan(model_dir, data, run_dir, **extra):
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.plan import plan_rl
    from tests.conftest import rl_overrides

    return plan_rl(load_config(RLConfig, "grpo", rl_overrides(model_dir, data, str(run_dir), **{**VLLM, **extra})))


def test_the_cpu_build_is_accepted_on_the_cpu_only(vllm_model_dir, arith_data, tmp_path):
    from reinforge.config.load import ConfigError
    from reinforge.workers.rollout import check_rollout_device

    assert _plan(vllm_model_dir, arith_data, tmp_path).cfg.rollout.backend == "vllm"
    with pytest.raises(ConfigError, match="the installed vLLM is its CPU build.*'cuda'"):
        check_rollout_device("vllm", "cuda")


@pytest.mark.parametrize("extra,match", [
    ({"rollout.staleness": 1}, r"rollout.staleness=1 needs rollout.backend=lean"),
    ({"rollout.staleness": 2, "trainer.backend": "ray", "trainer.rollout_workers": 1},
     r"rollout.staleness=2 needs rollout.backend=lean"),
    ({"rollout.temperature": 2.5}, r"rollout.temperature=2.5 is outside \[0.01, 2.0\]"),
])
def test_paths_vllm_cannot_run_are_refused(extra, match, vllm_model_dir, arith_data, tmp_path):
    from reinforge.config.load import ConfigError

    with pytest.raises(ConfigError, match=match) as err:
        _plan(vllm_model_dir, arith_data, tmp_path, **extra)
    assert "\n" not in str(err.value)


def test_a_vision_language_policy_is_refused(tmp_path, arith_data):
    """A Qwen2-VL policy: the engine would not see the images (refused before any model loads)."""
    from reinforge.config.load import ConfigError, load_config
    from reinforge.config.schema import RLConfig
    from reinforge.models.archs import save_arch
    from reinforge.trainers.plan import resolve
    from tests.conftest import rl_overrides

    folder = tmp_path / "vlm"
    save_arch("qwen2-vl-tiny", str(folder))
    cfg = load_config(RLConfig, "grpo", rl_overrides(str(folder), arith_data, str(tmp_path / "run"), **VLLM))
    why = "rollout.backend=vllm: .* is a vision-language model; its engine does not see"
    with pytest.raises(ConfigError, match=why):
        resolve(cfg)
