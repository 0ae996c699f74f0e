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
