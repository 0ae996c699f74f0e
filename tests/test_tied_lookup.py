"""models/tied_lookup.py: the tied embedding's lookup gradient added into the weight's .grad in place.

Every gradient is compared with the plain nn.Embedding's on a copy of the same model, relative
to the gradient's largest entry (only the order of summing the looked-up rows differs)."""
import copy

import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from reinforge.models.forward import response_logprobs
from reinforge.models.tied_lookup import TiedEmbedding, tie_lookup, untie_lookup

V, PAD = 97, 0


@pytest.fixture(autouse=True)
def small_tables(monkeypatch):
    """tie_lookup swaps only real vocabularies' tables; these tests' 97 x 32 one qualifies here."""
    import reinforge.models.tied_lookup as tl

    monkeypatch.setattr(tl, "MIN_NUMEL", 0)


def _model(tied: bool = True, pad: int | None = PAD) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tied, pad_token_id=pad)
    return Qwen2ForCausalLM(cfg)


def _pair(**kw):
    plain = _model(**kw)
    tied = copy.deepcopy(plain)
    assert tie_lookup(tied) is True
    return plain, tied


def _ids(seed: int, B: int = 3, L: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, L), generator=g)
    ids[0, :3] = PAD  # left padding: the padding row gets no gradient from the lookup
    ids[:, 5] = ids[1, 4]  # a repeated id: rows added into the same gradient row
    mask = (ids != PAD).long()
    return ids, mask


def _loss(model, seed: int) -> torch.Tensor:
    ids, mask = _ids(seed)
    lp, ent = response_logprobs(model, ids, mask, 6, with_entropy=True)
    return -(lp * mask[:, -6:]).sum() - 0.1 * ent.sum()


def _assert_grads_match(plain, tied, tol: float = 1e-5):
    for (name, p), q in zip(plain.named_parameters(), tied.parameters()):
        assert q.grad is not None, name
        scale = p.grad.abs().max().clamp(min=1e-12)
        assert ((p.grad - q.grad).abs().max() / scale) < tol, name


def test_swaps_only_a_tied_plain_embedding(monkeypatch):
    import reinforge.models.tied_lookup as tl

    plain, tied = _pair()
    assert type(tied.get_input_embeddings()) is TiedEmbedding
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    assert tie_lookup(_model(tied=False)) is False  # untied: its lookup gradient is its own .grad anyway
    monkeypatch.setattr(tl, "MIN_NUMEL", V * 32 + 1)
    assert tie_lookup(_model()) is False  # below the size: autograd's lookup, numerics unchanged
    untie_lookup(tied)
    assert type(tied.get_input_embeddings()) is nn.Embedding
    assert tied.state_dict().keys() == plain.state_dict().keys()


def test_gradients_equal_the_plain_lookups_over_two_micro_batches():
    plain, tied = _pair()
    for seed in (1, 2):  # accumulation: the second backward adds into the first one's .grad
        _loss(plain, seed).backward()
        _loss(tied, seed).backward()
    _assert_grads_match(plain, tied)


def test_padding_row_and_lookup_only_gradient():
    """With no head in the loss the lookup's backward runs with no .grad yet: it creates it; the
    padding id's row gets nothing, as embedding_backward does."""
    plain, tied = _pair()
    ids, _ = _ids(3)
    w = torch.randn(ids.shape + (32,))
    for m in (plain, tied):
        (m.get_input_embeddings()(ids) * w).sum().backward()
    g_plain, g_tied = plain.get_input_embeddings().weight.grad, tied.get_input_embeddings().weight.grad
    assert g_tied[PAD].abs().max() == 0
    torch.testing.assert_close(g_tied, g_plain, rtol=0, atol=1e-5)


def test_no_grad_and_frozen_lookups_are_plain():
    _, tied = _pair()
    ids, _ = _ids(4)
    emb = tied.get_input_embeddings()
    with torch.no_grad():
        out = emb(ids)
    assert not out.requires_grad and out.grad_fn is None
    emb.weight.requires_grad_(False)
    out = emb(ids)
    assert out.grad_fn is None
    torch.testing.assert_close(out, nn.functional.embedding(ids, emb.weight, PAD))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_loaded_training_model_is_tied_and_learns_the_same(tmp_path, checkpointing):
    """load_causal_lm(train=True) swaps the lookup; with activation checkpointing the gradients
    are still the plain ones."""
    from reinforge.models.loading import load_causal_lm

    _model().save_pretrained(tmp_path)
    tied = load_causal_lm(str(tmp_path), dtype="float32", gradient_checkpointing=checkpointing)
    ref = load_causal_lm(str(tmp_path), dtype="float32", train=False)
    assert type(tied.get_input_embeddings()) is TiedEmbedding
    assert type(ref.get_input_embeddings()) is nn.Embedding  # no gradients: nothing to change
    plain = copy.deepcopy(tied)
    untie_lookup(plain)
    _loss(plain, 5).backward()
    _loss(tied, 5).backward()
    _assert_grads_match(plain, tied)


def test_fsdp_sharding_restores_the_plain_lookup():
    """shard_model undoes the swap before fully_shard (FSDP reduces what autograd gives it), and the
    sharded model's gradients are the plain model's (one gloo rank)."""
    import socket

    import torch.distributed as dist

    from reinforge.distributed.fsdp import shard_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plain, tied = _pair()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        shard_model(tied)
        assert not any(type(m) is TiedEmbedding for m in tied.modules())
        _loss(plain, 6).backward()
        _loss(tied, 6).backward()
        for (name, p), q in zip(plain.named_parameters(), tied.parameters()):
            g = q.grad.full_tensor() if hasattr(q.grad, "full_tensor") else q.grad
            assert (p.grad - g).abs().max() <= 1e-5 * p.grad.abs().max(), name
    finally:
        dist.destroy_process_group()
