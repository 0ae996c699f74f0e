"""The parts of the vLLM rollout that run without a GPU: the truncated importance-sampling
weights and their use in the actor's loss, and the lazy import (vllm itself is not needed)."""
from __future__ import annotations

import math
import sys

import torch

from reinforge.algos.tis import tis_weights


def test_vllm_module_imports_without_vllm():
    import subprocess

    code = "import sys, reinforge.workers.rollout.vllm; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)  # vllm is imported only when the engine starts


def test_tis_weights_against_loop():
    g = torch.Generator().manual_seed(0)
    old, roll = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    w, m = tis_weights(old, roll, mask, cap=2.0)
    for b in range(3):
        for t in range(5):
            want = min(math.exp(old[b, t] - roll[b, t]), 2.0) if mask[b, t] else 0.0
            assert abs(float(w[b, t]) - want) < 1e-5
    clipped = [(math.exp(old[b, t] - roll[b, t]) > 2.0) for b in range(3) for t in range(5) if mask[b, t]]
    assert abs(float(m["rollout_corr/tis_clip_frac"]) - sum(clipped) / len(clipped)) < 1e-6


def test_actor_applies_tis_weights(tiny_model_dir):
    """Rollout log-probs equal to the trainer's give weights of 1 (the update is unchanged);
    a gap changes the update and is reported."""
    from tests.test_packing import _actor, _rl_batch

    a, b, c = (_actor(tiny_model_dir, False, 0, micro=6, tis_cap=2.0) for _ in range(3))
    batch = _rl_batch(a.model.config.vocab_size)
    batch = batch | a.log_probs(batch).select(["old_log_probs"])
    m_plain = a.update(batch)
    m_same = b.update(batch | _with(batch, batch["old_log_probs"]))
    m_gap = c.update(batch | _with(batch, batch["old_log_probs"] - 0.5))
    for (k, pa), pb, pc in zip(a.model.named_parameters(), b.model.parameters(), c.model.parameters()):
        assert torch.equal(pa, pb), k
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.model.parameters(), c.model.parameters()))
    assert abs(m_plain["actor/pg_loss"] - m_same["actor/pg_loss"]) < 1e-7
    assert m_same["rollout_corr/tis_weight_mean"] == 1.0 and m_gap["rollout_corr/tis_clip_frac"] == 0.0
    assert abs(m_gap["rollout_corr/logprob_gap_abs_mean"] - 0.5) < 1e-5
    # Every response token has old - rollout = 0.5, below log(cap): each weight is exp(0.5).
    assert abs(m_gap["rollout_corr/tis_weight_mean"] - math.exp(0.5)) < 1e-5


def _with(batch, rollout_lp):
    from reinforge.protocol import Batch

    return Batch({"rollout_log_probs": rollout_lp * batch["response_mask"]})


# ---- the engine's calls, on a fake vLLM (issue 22, items 2-6): what reinforge calls, in what order ----
class _FakeVLLMModel:
    """vLLM's model inside the engine: load_weights takes (HF name, tensor) pairs."""

    def __init__(self, log):
        self.log, self.loaded = log, {}

    def load_weights(self, weights):
        for name, t in weights:
            self.loaded[name] = t.detach().clone()
        self.log.append("load_weights")


class _FakeLLM:
    """The LLM calls VLLMRollout makes; its constructor seeds the global RNGs as vLLM's does."""

    log: list = []

    def __init__(self, model, seed=0, **kw):
        import random

        import numpy as np

        self.kw, self.model = dict(model=model, seed=seed, **kw), _FakeVLLMModel(self.log)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.log.append("LLM")

    def apply_model(self, fn):
        return [fn(self.model)]

    def collective_rpc(self, fn, args=()):
        """The in-process engine's one worker: a runner without an iterator reload, so
        reload_into takes its fallback, the model's load_weights."""
        import types

        worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(get_model=lambda: self.model))
        return [fn(worker, *args)]

    def reset_prefix_cache(self):
        self.log.append("reset_prefix_cache")

    def wake_up(self, tags=None):
        self.log.append(("wake_up", tuple(tags)))

    def sleep(self, level=1):
        self.log.append(("sleep", level))


def _fake_vllm(monkeypatch):
    import types

    _FakeLLM.log = []
    platform = types.SimpleNamespace(is_cpu=lambda: False, is_cuda=lambda: True, device_type="cuda")
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_FakeLLM, __version__="fake"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=platform))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: _FakeLLM.log.append("empty_cache"))
    return _FakeLLM.log


def _rollout(model_dir, model=None, **kw):
    from reinforge.models.loading import load_causal_lm, load_tokenizer
    from reinforge.workers.rollout.vllm import VLLMRollout

    model = model if model is not None else load_causal_lm(model_dir, dtype="float32")
    return VLLMRollout(model, load_tokenizer(model_dir), max_prompt_length=8, max_response_length=6,
                       model_path=model_dir, seed=123, **kw)


def test_engine_build_restores_the_global_rngs(tiny_model_dir, monkeypatch):
    """The fake engine reseeds python, numpy and torch with seed=123; the draws after the
    build are the ones the process would have made without it."""
    import random

    import numpy as np

    _fake_vllm(monkeypatch)
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir, dtype="float32")
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    want = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    r = _rollout(tiny_model_dir, model)
    assert r.llm.kw["seed"] == 123
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == want


def test_rank_engine_wakes_weights_loads_then_wakes_kv_cache(tiny_model_dir, monkeypatch):
    """A sleeping engine in a Ray rank: torch's cache emptied, weights woken, the new weights
    loaded, then the KV cache woken (and its prefix cache reset), asleep again after."""
    from reinforge.distributed.engine import RankEngine

    log = _fake_vllm(monkeypatch)
    r = _rollout(tiny_model_dir, enable_sleep_mode=True)
    assert log == ["LLM", "load_weights", "reset_prefix_cache", ("sleep", 1), "empty_cache"]  # built asleep
    log.clear()
    assert RankEngine(r).generate(r.model, 1, None, {}, None) is None  # a rank with no prompts still syncs
    assert log == ["empty_cache", ("wake_up", ("weights",)), "load_weights", "reset_prefix_cache",
                   ("wake_up", ("kv_cache",)), "reset_prefix_cache", ("sleep", 1), "empty_cache"]


def test_quantized_model_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    """load_weights skips vLLM's post-load processing, which quantized layers need: refused at
    config time (config.json) and at the engine build, before any engine starts."""
    import json
    import shutil

    import pytest

    from reinforge.config.load import ConfigError
    from reinforge.models.loading import load_causal_lm
    from reinforge.workers.rollout import check_rollout_backend

    log = _fake_vllm(monkeypatch)
    model = load_causal_lm(tiny_model_dir, dtype="float32")
    model.config.quantization_config = {"quant_method": "fp8"}
    with pytest.raises(ValueError, match="quant_method='fp8'"):
        _rollout(tiny_model_dir, model)
    assert log == []
    folder = tmp_path / "fp8"
    shutil.copytree(tiny_model_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(ConfigError, match="rollout.backend='vllm'.*quantized"):
        check_rollout_backend("vllm", model_path=str(folder))
    check_rollout_backend("vllm", model_path=tiny_model_dir)
    check_rollout_backend("lean", model_path=str(folder))  # the in-process loops run the model as transformers does


def test_vllm_temperature_range_is_checked_at_config_time(tiny_model_dir, arith_data, tmp_path):
    """vLLM samples at 0.01 when asked for 0.005 and refuses 2.5: both refused up front."""
    import pytest

    from reinforge.config.load import ConfigError, load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.plan import plan_rl
    from reinforge.workers.rollout import check_rollout_backend
    from tests.conftest import rl_overrides

    for bad in (0.005, 2.5):
        with pytest.raises(ConfigError, match=rf"rollout.temperature={bad} is outside \[0.01, 2.0\]"):
            check_rollout_backend("vllm", temperatures={"rollout.temperature": bad})
        check_rollout_backend("lean", temperatures={"rollout.temperature": bad})
    check_rollout_backend("vllm", temperatures={"rollout.temperature": 0.01, "rollout.val_temperature": 2.0})
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "run"),
                                                      **{"rollout.backend": "vllm", "rollout.val_temperature": 3.0}))
    with pytest.raises(ConfigError, match="rollout.val_temperature=3.0"):
        plan_rl(cfg)  # before the device check: the message a CPU user meets too


def test_sampling_params_refuse_an_unsampled_temperature(tiny_model_dir, monkeypatch):
    import pytest

    _fake_vllm(monkeypatch)
    r = _rollout(tiny_model_dir)
    with pytest.raises(ValueError, match="outside"):
        r._params(1, 0.001, greedy=False)


def test_lora_sync_leaves_the_base_bit_identical(tiny_model_dir, monkeypatch):
    """A bf16 LoRA actor synced into the (fake) engine three times: the frozen base weights
    and the adapter are bit-identical afterwards (no in-place merge / unmerge), and the engine
    got each adapted weight merged, W + scale * B @ A, under its Hugging Face name."""
    from reinforge.models.loading import load_causal_lm
    from reinforge.models.lora import apply_lora

    _fake_vllm(monkeypatch)
    model = apply_lora(load_causal_lm(tiny_model_dir, dtype="bfloat16"), 4, 8.0, ["q_proj", "v_proj"])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:  # a trained adapter: B is no longer zero
                p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    r = _rollout(tiny_model_dir, model)
    for _ in range(2):
        r.sync_weights(model)
    for n, p in model.state_dict().items():
        assert torch.equal(p, before[n]), n
    loaded = r.llm.model.loaded
    assert not any("lora_" in k or "base_layer" in k for k in loaded)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    a, b = layer.lora_A["default"].weight.float(), layer.lora_B["default"].weight.float()
    want = (layer.base_layer.weight.float() + layer.scaling["default"] * (b @ a)).to(torch.bfloat16)
    assert torch.equal(loaded["model.layers.0.self_attn.q_proj.weight"], want)
    assert torch.equal(loaded["model.layers.0.self_attn.k_proj.weight"],
                       model.base_model.model.model.layers[0].self_attn.k_proj.weight)
