"""Linear weights reordered once per generation (workers/rollout/packed_linears.py).

bf16: the packed product is the same oneDNN kernel without the per-call reorder, so a bf16
decode gives bit-identical tokens and log-probs packed or not. fp32: oneDNN instead of the BLAS
(another summation order), so only large models pack; forced on the tiny model it stays within
1e-5 of the plain layers. Every layer's own forward is back after the block, also after an
error, and a tied weight is packed once. The lean loop's reused (B, V) buffers give the sampler
the same values as fresh tensors.
"""
from __future__ import annotations

import pytest
import torch

from reinforge.protocol import Batch
from reinforge.workers.rollout import packed_linears as pl
from reinforge.workers.rollout.lean import LeanRollout, sample_large_vocab

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not pl.available(), reason="this torch build has no oneDNN prepacked linear")]


def _load(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def _prompts(tok) -> Batch:
    return Batch({"uid": torch.arange(3)}, {"prompt_ids": [tok.encode(t, add_special_tokens=False)
                                                           for t in ("1+2=", "13+4=", "7*8=")]})


def test_bf16_decode_is_bit_identical_packed_or_not(tiny_model_dir):
    model, tok = _load(tiny_model_dir)
    rollout = LeanRollout(model, tok, max_prompt_length=8, max_response_length=8, ignore_eos=True, dtype="bfloat16")
    assert pl.should_pack(model, torch.bfloat16)
    out = {}
    for pack in (False, True):
        rollout.pack = pack
        torch.manual_seed(0)
        out[pack] = rollout.generate(_prompts(tok), n=4)
    assert torch.equal(out[True]["responses"], out[False]["responses"])
    assert torch.equal(out[True]["rollout_log_probs"], out[False]["rollout_log_probs"])


def test_bf16_decode_packs_linear_weights_without_a_whole_model_copy(tiny_model_dir, monkeypatch):
    """The packed linears' weights are cast one at a time as they are packed: during the
    generation they are still the fp32 training tensors (no bf16 copy of them), the embedding
    table and the norms are bf16 copies, and every parameter is its own tensor again after."""
    model, tok = _load(tiny_model_dir)
    rollout = LeanRollout(model, tok, max_prompt_length=8, max_response_length=4, ignore_eos=True, dtype="bfloat16")
    later = pl.linear_only_weights(model)
    linear_w = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    tied = id(model.get_input_embeddings().weight)
    assert later and later <= linear_w and tied not in later  # the lookup reads the table
    before = {id(p): (p.data_ptr(), p.dtype) for p in model.parameters()}
    seen = {}
    real = pl._packed_forward

    def spy(packed, bias, x):
        seen.update({id(p): p.dtype for p in model.parameters()})
        return real(packed, bias, x)

    monkeypatch.setattr(pl, "_packed_forward", spy)
    rollout.generate(_prompts(tok), n=2)
    assert seen and all(seen[i] == (torch.float32 if i in later else torch.bfloat16) for i in seen)
    assert {id(p): (p.data_ptr(), p.dtype) for p in model.parameters()} == before


def test_only_packed_weights_are_left_out_of_the_copy():
    """A PEFT model casts every weight whole; a linear that packed_linears would not pack stays in."""
    inner = torch.nn.Linear(4, 4)
    wrapper = torch.nn.Module()
    wrapper.base_layer, wrapper.lora_A = inner, torch.nn.Linear(4, 2)
    assert pl.linear_only_weights(wrapper) == frozenset()
    assert pl.linear_only_weights(torch.nn.Sequential(inner)) == frozenset({id(inner.weight)})
    half = torch.nn.Linear(4, 4).half()  # not packed (neither bf16 nor fp32): it must stay in the copy
    assert pl.linear_only_weights(torch.nn.Sequential(inner, half)) == frozenset({id(inner.weight)})


def test_fp32_packs_only_large_models_and_stays_within_1e5(tiny_model_dir, monkeypatch):
    model, _ = _load(tiny_model_dir)
    assert not pl.should_pack(model, torch.float32)  # 3M parameters: the plain BLAS path
    monkeypatch.setattr(pl, "large", lambda n: True)
    assert pl.should_pack(model, torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids).logits
        with pl.packed_linears(model, rows=4):
            packed = model(ids).logits
    assert (packed - plain).abs().max() <= 1e-5 * plain.abs().max()


def test_layers_are_restored_and_tied_weights_packed_once(tiny_model_dir, monkeypatch):
    model, _ = _load(tiny_model_dir)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    distinct = {m.weight.data_ptr() for m in linears}
    calls = []
    real = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(pl.torch.ops.mkldnn, "_reorder_linear_weight", lambda w, r: calls.append(w) or real(w, r),
                        raising=False)
    with pytest.raises(RuntimeError, match="inside"):
        with pl.packed_linears(model, rows=2):
            assert all("forward" in vars(m) for m in linears)
            raise RuntimeError("inside")
    assert not any("forward" in vars(m) for m in linears)  # the class's forward again
    assert len(calls) == len(distinct)
    with pl.packed_linears(model, rows=2, enabled=False):
        assert not any("forward" in vars(m) for m in linears)


def test_large_vocab_sampler_with_a_reused_buffer_gives_the_same_draw():
    logits = torch.randn(5, 1 << 16, generator=torch.Generator().manual_seed(2)) * 3
    work = torch.full((8, 1 << 16), float("nan"))  # larger than needed and dirty: only its first rows are used
    fresh = sample_large_vocab(logits, 1.0, generator=torch.Generator().manual_seed(0))
    reused = sample_large_vocab(logits, 1.0, generator=torch.Generator().manual_seed(0), work=work)
    assert torch.equal(fresh[0], reused[0]) and torch.equal(fresh[1], reused[1])
