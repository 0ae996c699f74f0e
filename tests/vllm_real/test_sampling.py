"""Sampling on the real engine: per-prompt seeds (a prompt's samples depend on its seed only,
not on the rest of the batch), and the rollout Batch's masks where the engine stops."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

from tests.vllm_real.conftest import PROMPTS, perturb, prompt_batch, use  # noqa: E402


def test_per_prompt_seeds_are_batch_independent(engine, vllm_model_dir):
    """Prompt 0 with seed 5: the same samples alone, first or last in a batch; another seed differs."""
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(vllm_model_dir, dtype="float32")
    perturb(model, seed=8)
    r = use(engine, model)
    p0, p1, p2 = PROMPTS

    def rows(prompts, seeds, i):
        b = r.generate(prompt_batch(prompts), n=3, temperature=1.0, seeds=seeds)
        return b["responses"][3 * i:3 * i + 3], b["rollout_log_probs"][3 * i:3 * i + 3]

    alone, lp = rows([p0], [5], 0)
    for prompts, seeds, i in (([p1, p0], [9, 5], 1), ([p0, p2, p1], [5, 1, 2], 0), ([p0], [5], 0)):
        got, got_lp = rows(prompts, seeds, i)
        assert torch.equal(got, alone), (prompts, seeds)
        assert torch.allclose(got_lp, lp, atol=1e-5)
    assert not torch.equal(rows([p0], [6], 0)[0], alone)
    assert len({tuple(x.tolist()) for x in alone}) > 1  # the n samples of one prompt differ from each other
