"""Gemma 3 as reinforge drives it, on tiny random models built from the real Gemma-3-270M
config's values (models/pretrained.py's gemma3-270m, converted: gemma3_text, GELU-tanh MLP, the
input embedding scaled by sqrt(hidden), query_pre_attn_scalar = head_dim, sliding-window layers
before every full one, two RoPE bases, tied head; no final soft-cap in Gemma 3, which Gemma 2's
cap of 30 stands in for here): reinforge's log-probs (fused, through logits, packed) equal
transformers' own forward, the scaled embedding survives the tied-lookup swap, and the lean
engine, which cannot drive Gemma's layers, falls back to generate() and is refused for the
asynchronous producer before a model loads. The real checkpoint's runs: docs/models_and_data.md."""
from __future__ import annotations

import math

import pytest
import torch

from reinforge.models.forward import response_logprobs
from reinforge.models.packing import packed_response_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")

V, H, HEAD = 300, 64, 16


def gemma3(softcap: float | None = None, seed: int = 0):
    """A 3-layer Gemma3ForCausalLM: two sliding-window layers (window 4, so the test sequences
    outrun it) and one full, the real model's other hyperparameters."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=V, hidden_size=H, intermediate_size=4 * H, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=HEAD, query_pre_attn_scalar=HEAD, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, final_logit_softcapping=softcap,
        attn_logit_softcapping=None, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        max_position_embeddings=128, attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():  # spread logits (random init gives ~+-0.1), so a cap of 2 changes them a lot
        model.model.embed_tokens.weight.mul_(0.5 / model.model.embed_tokens.weight.std())
    return model


def _batch(B: int = 3, P: int = 6, T: int = 7):
    """Left-padded prompts and right-padded responses of varied lengths, sequences up to 13 long."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (B, P + T), generator=g)
    mask = torch.ones(B, P + T, dtype=torch.long)
    mask[1, :2] = 0
    mask[2, :3] = 0
    mask[2, -2:] = 0
    return ids * mask, mask, T


def _hf_logprobs(model, ids, mask, T):
    """transformers' own forward, one unpadded sequence at a time: log_softmax of its logits."""
    out = torch.zeros(ids.shape[0], T)
    for b in range(ids.shape[0]):
        keep = mask[b].bool()
        seq = ids[b][keep][None]
        with torch.no_grad():
            logp = model(seq).logits[0, :-1].log_softmax(-1)
        lab = seq[0, 1:]
        per = logp.gather(-1, lab[:, None])[:, 0]  # predicts tokens 1..n-1
        resp = keep[-T:]
        n_resp = int(resp.sum())
        out[b, :n_resp] = per[-n_resp:]
    return out


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_logprobs_equal_transformers_forward(softcap):
    model = gemma3(softcap)
    ids, mask, T = _batch()
    want = _hf_logprobs(model, ids, mask, T)
    m = mask[:, -T:].bool()
    raw = torch.zeros_like(want)
    if softcap:  # the cap matters: without it the log-probs differ
        model.config.final_logit_softcapping = None
        raw = _hf_logprobs(model, ids, mask, T)
        model.config.final_logit_softcapping = softcap
        assert (raw - want)[m].abs().max() > 0.05
    with torch.no_grad():
        for fused in (True, False):
            got, _ = response_logprobs(model, ids, mask, T, fused=fused)
            torch.testing.assert_close(got[m], want[m], atol=2e-5, rtol=0)
            packed, _ = packed_response_logprobs(model, ids, mask, T, fused=fused)
            torch.testing.assert_close(packed[m], want[m], atol=2e-5, rtol=0)


def test_scaled_embedding_is_kept_by_the_tied_lookup(monkeypatch):
    """Gemma's embedding multiplies by sqrt(hidden); the tied-lookup swap (for real-vocabulary
    tables, models/tied_lookup.py) replaces only a plain nn.Embedding, so it leaves Gemma's alone
    even at the real table's size, and the scale stays in the forward and the gradient."""
    from reinforge.models import tied_lookup

    model = gemma3()
    emb = model.model.embed_tokens
    assert float(emb.embed_scale) == pytest.approx(math.sqrt(H))
    monkeypatch.setattr(tied_lookup, "MIN_NUMEL", 0)  # as at Gemma-3-270M's 262,144 x 640
    assert not tied_lookup.tie_lookup(model) and type(emb).__name__ == "Gemma3TextScaledWordEmbedding"
    ids = torch.tensor([[5, 7, 9]])
    torch.testing.assert_close(emb(ids), emb.weight[ids] * math.sqrt(H))


def test_lean_falls_back_to_generate_and_async_is_refused(tmp_path, capsys):
    from reinforge.config.load import ConfigError
    from reinforge.protocol import Batch
    from reinforge.workers.rollout import check_rollout_backend
    from reinforge.workers.rollout.lean import LeanRollout, lean_supported

    model = gemma3()
    assert not lean_supported(model)

    class Tok:  # the few attributes a rollout reads
        eos_token_id, pad_token_id, chat_template = 1, 0, None

        def convert_ids_to_tokens(self, i):
            return str(i)

        def batch_decode(self, rows, **kw):
            return [" ".join(map(str, r)) for r in rows]

        def decode(self, row, **kw):
            return " ".join(map(str, row))

    from reinforge.workers.rollout import lean

    lean._TOLD.discard("gemma3_text")
    rollout = LeanRollout(model, Tok(), max_prompt_length=6, max_response_length=5)
    LeanRollout(model, Tok(), max_prompt_length=6, max_response_length=5)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the lean loop does not drive model_type 'gemma3_text'" in err  # said once
    assert not rollout.capabilities.async_ok and not rollout.supports_refresh
    prompts = Batch({"uid": torch.arange(2)}, {"prompt_ids": [[2, 10, 11, 12], [2, 20, 21]]})
    out = rollout.generate(prompts, n=1, greedy=True)
    for i, row in enumerate(prompts["prompt_ids"]):
        with torch.no_grad():
            want = model.generate(torch.tensor([row]), max_new_tokens=5, do_sample=False, eos_token_id=1,
                                  pad_token_id=0)[0, len(row):]
        got = out["responses"][i][out["response_mask"][i].bool()]
        assert got.tolist() == want[:len(got)].tolist() and len(got) >= 1
    model.save_pretrained(tmp_path / "gemma")  # the producer is refused before any model loads
    with pytest.raises(ConfigError, match=r"rollout.staleness=1 needs the lean decoding loop, which does not drive "
                                          r"model.path=.*gemma' \(model_type 'gemma3_text'; .*set rollout.staleness=0"):
        check_rollout_backend("lean", staleness=1, model_path=str(tmp_path / "gemma"))
    check_rollout_backend("lean", staleness=0, model_path=str(tmp_path / "gemma"))  # synchronous: generate() serves


def test_lean_drives_reads_the_config_without_torch():
    from reinforge.workers.rollout.base import lean_drives

    assert lean_drives({"model_type": "llama"})
    assert lean_drives({"model_type": "qwen3", "layer_types": ["full_attention"]})
    assert not lean_drives({"model_type": "gemma3_text"})
    assert not lean_drives({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]})


def test_plain_text_prompts_start_with_the_tokenizers_bos(real_tok, smollm2_tiny_folder, tmp_path):
    """A tokenizer that adds BOS (Gemma's <bos>; here Llama 3's <|begin_of_text|>, fetched with the
    real vocabularies) gives plain-text prompts their BOS in RL, SFT and preference rows, once:
    a chat-rendered prompt, whose template writes BOS, does not get a second. Gemma-3-270M
    without it: greedy `12+30=` -> `30303030` (with: `42`). ChatML tokenizers add none."""
    from reinforge.data import RLDataset, write_rows
    from reinforge.data.preference import PreferenceDataset
    from reinforge.data.sft import SFTDataset
    from reinforge.data.text import bos_prefix
    from reinforge.models.loading import load_tokenizer

    tok = real_tok("llama-3.2-1b")
    bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
    assert bos_prefix(tok) == [bos] and bos_prefix(load_tokenizer(smollm2_tiny_folder)) == []
    chat = [{"role": "user", "content": "12+30="}]
    rl = write_rows([{"prompt": "12+30=", "reward_model": {"ground_truth": "42"}},
                     {"prompt": chat, "reward_model": {"ground_truth": "42"}}], str(tmp_path / "rl.jsonl"))
    plain, templated = [it["prompt_ids"] for it in RLDataset(rl, tok, max_prompt_length=64)]
    assert plain == [bos] + tok("12+30=", add_special_tokens=False)["input_ids"]
    assert templated[0] == bos and templated.count(bos) == 1
    sft = SFTDataset(write_rows([{"prompt": "12+30=", "response": "42"}], str(tmp_path / "sft.jsonl")), tok,
                     max_length=64).items[0]
    assert sft["input_ids"][0] == bos and sft["input_ids"].count(bos) == 1 and sft["loss_mask"][0] == 0
    assert sft["input_ids"] == plain + tok("42", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    pref = PreferenceDataset(write_rows([{"prompt": "12+30=", "chosen": "42", "rejected": "43"}],
                                        str(tmp_path / "p.jsonl")), tok, max_length=64).items[0]
    assert pref["prompt_ids"] == plain
