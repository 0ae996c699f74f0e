"""Weight sync on the real engine: after the actor's weights change and `sync_weights`, the
engine's log-probs of what it samples equal the trainer's forward of the new weights (fp32:
within 1e-4), for a full and a LoRA actor, after sleep / wake, for an engine built for a resumed
actor, and with the prefix cache holding KV of the old weights."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

from tests.vllm_real.conftest import logprob_gap, perturb, use as _use  # noqa: E402

TOL = 1e-4


def test_sync_weights_parity_fp32(engine, vllm_model_dir):
    """The failing step of issue 36: the engine's log-probs after a sync were those of a model
    whose tied LM head kept the old weights (vLLM's CPU reload leaves its packed copy alone).
    The first generation fills the prefix cache with KV of the old weights; the second, with the
    same prompts, must not read it."""
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(vllm_model_dir, dtype="float32")
    _use(engine, model)
    before, _, _ = logprob_gap(engine, model)
    assert before < TOL, before
    perturb(model, seed=1)
    engine.sync_weights(model)
    after, mean, _ = logprob_gap(engine, model)
    print(f"fp32 sync: max |gap| before {before:.2e}, after {after:.2e} (mean {mean:.2e})")
    assert after < TOL, after
    perturb(model, seed=2)  # and again: every sync, not only the first
    engine.sync_weights(model)
    assert logprob_gap(engine, model)[0] < TOL


def test_greedy_tokens_are_the_trainers_argmax(engine, vllm_model_dir):
    """Greedy validation on the engine: each token is the trainer's argmax (up to a 1e-4 tie)."""
    from reinforge.models.forward import response_logprobs
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(vllm_model_dir, dtype="float32")
    perturb(model, seed=3)
    _use(engine, model)
    gap, _, b = logprob_gap(engine, model, n=1, greedy=True)
    assert gap < TOL and b.meta["temperature"] == 1.0
    with torch.no_grad():
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    logp = torch.log_softmax(out.logits[:, -b["responses"].shape[1] - 1:-1].float(), -1)
    chosen = response_logprobs(model, b["input_ids"], b["attention_mask"], b["responses"].shape[1])[0]
    best = logp.max(-1).values
    m = b["response_mask"].bool()
    assert ((best - chosen)[m] < TOL).all()


def test_lora_actor_sync(engine, vllm_model_dir):
    """A LoRA actor: the engine gets W + scale * B @ A (merged out of place), its log-probs equal
    the trainer's forward of the adapted model, and the base weights are bit-identical after."""
    from reinforge.models.loading import load_causal_lm
    from reinforge.models.lora import apply_lora

    model = apply_lora(load_causal_lm(vllm_model_dir, dtype="float32"), 4, 8.0, ["q_proj", "v_proj", "up_proj"])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:  # a trained adapter: B is no longer zero
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    base = {n: p.detach().clone() for n, p in model.state_dict().items()}
    _use(engine, model)
    gap, _, _ = logprob_gap(engine, model)
    assert gap < TOL, gap
    for n, p in model.state_dict().items():
        assert torch.equal(p, base[n]), n
    with model.disable_adapter():  # the adapter does change the engine's model: the base's log-probs differ
        assert logprob_gap(engine, model)[0] > 1e-2


def test_sleep_and_wake_keep_the_synced_weights(engine, vllm_model_dir):
    """sleep / wake on the CPU engine (a no-op there: nothing to free for a trainer) and a sync in
    a rank's order (wake weights, load, wake KV cache) keep the parity."""
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(vllm_model_dir, dtype="float32")
    perturb(model, seed=4)
    _use(engine, model)
    engine.sleep()
    engine.wake_up()
    assert logprob_gap(engine, model)[0] < TOL
    perturb(model, seed=5)
    engine.sleep()
    engine.wake_up(["weights"])
    engine.sync_weights(model)
    engine.wake_up(["kv_cache"])
    assert logprob_gap(engine, model)[0] < TOL
