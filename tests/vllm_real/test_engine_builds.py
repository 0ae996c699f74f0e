"""Engines built for one test each (closed after it): for a resumed actor, and in bf16."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

from tests.vllm_real.conftest import fresh_engine, logprob_gap, perturb  # noqa: E402

TOL = 1e-4


def test_engine_built_for_a_resumed_actor(vllm_model_dir):
    """A resumed run builds the engine from model.path, the actor holding the checkpoint's
    weights: the build syncs them, so the first generation is already the actor's."""
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(vllm_model_dir, dtype="float32")
    perturb(model, seed=6)
    with fresh_engine(vllm_model_dir, model) as r:
        assert logprob_gap(r, model)[0] < TOL
    n = torch.get_num_threads()
    try:  # vLLM's CPU worker replaces torch.set_num_threads with a no-op; the build puts it back
        torch.set_num_threads(1 if n > 1 else 2)
        assert torch.get_num_threads() == (1 if n > 1 else 2)
    finally:
        torch.set_num_threads(n)


def test_bf16_gap_is_reported(vllm_model_dir):
    """bf16: the engine's kernels and the trainer's forward round differently; the gap is what
    rollout_corr/* reports (truncated IS corrects it), bounded here."""
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(vllm_model_dir, dtype="bfloat16")
    perturb(model, seed=7)
    with fresh_engine(vllm_model_dir, model) as r:
        gap, mean, _ = logprob_gap(r, model)
    print(f"bf16 sync: max |gap| {gap:.3e}, mean {mean:.3e}")
    assert mean < 0.02 and gap < 0.1, (gap, mean)
