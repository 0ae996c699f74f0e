"""The rollout samples exactly the configured distribution, and the trainer scores that one.

The model folder's generation_config.json asks for other sampling (temperature 0.3, top_k 3,
top_p 0.5, repetition_penalty 5): both backends must ignore it. The rollout's log-probs of the
sampled tokens equal the actor's recomputed ones (same top-k/top-p filter) to 1e-5; with
top_k set, no sampled token lies outside its step's top-k; with the defaults, tokens outside
the folder's top-3 do occur. hf and lean give identical greedy outputs, the same Batch fields
and masks, and honour rollout.ignore_eos.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reinforge.config.schema import ModelConfig
from reinforge.models.forward import position_ids_from_mask
from reinforge.protocol import Batch
from reinforge.workers.actor import batch_log_probs
from reinforge.workers.rollout.hf import HFRollout
from reinforge.workers.rollout.lean import LeanRollout, lean_supported

pytestmark = pytest.mark.usefixtures("one_thread")
BACKENDS = {"hf": HFRollout, "lean": LeanRollout}
P, T = 8, 10


@pytest.fixture(scope="module")
def spread_model(tmp_path_factory):
    """(model, tokenizer) of a tiny Qwen2 whose logits are spread out (embeddings scaled up:
    a random init gives near-uniform logits, where top-k and greedy depend on float noise),
    loaded back from a folder whose generation_config.json sets its own sampling."""
    from transformers import AutoModelForCausalLM

    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer

    tok = build_char_tokenizer()
    model = make_tiny_model(tok, seed=3, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                            intermediate_size=128)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(3.0)  # tied: the LM head too
    g = model.generation_config
    g.do_sample, g.temperature, g.top_k, g.top_p, g.repetition_penalty = True, 0.3, 3, 0.5, 5.0
    out = tmp_path_factory.mktemp("spread_model")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    saved = json.loads((Path(out) / "generation_config.json").read_text())
    assert (saved["top_k"], saved["top_p"], saved["repetition_penalty"]) == (3, 0.5, 5.0)
    return AutoModelForCausalLM.from_pretrained(out), tok


def _prompts(tok, texts=("1+2=", "13+4=", "7*8=", "9-3=")) -> Batch:
    return Batch({"uid": torch.arange(len(texts))}, {"prompt_ids": [tok.encode(t, add_special_tokens=False)
                                                                    for t in texts]})


def _rollout(backend, model, tok, **kw):
    return BACKENDS[backend](model, tok, max_prompt_length=P, max_response_length=T, **kw)


def _step_logits(model, batch: Batch) -> torch.Tensor:
    """Full-vocabulary logits (B, T, V) that chose each response token, at T = 1."""
    fwd = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
               position_ids=position_ids_from_mask(batch["attention_mask"]))
    with torch.no_grad():
        return model(**fwd).logits[:, P - 1:-1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (4, 0.9), (0, 0.7)])
def test_rollout_log_probs_are_the_trainers(spread_model, backend, top_k, top_p):
    model, tok = spread_model
    torch.manual_seed(0)
    batch = _rollout(backend, model, tok, top_k=top_k, top_p=top_p).generate(_prompts(tok), n=8, temperature=1.3)
    assert batch.meta == {"temperature": 1.3, "top_k": top_k, "top_p": top_p}
    mask = batch["response_mask"].bool()
    recomputed, _ = batch_log_probs(model, batch, ModelConfig(), 8, 0, False)
    assert (batch["rollout_log_probs"][~mask] == 0).all()
    assert (recomputed - batch["rollout_log_probs"])[mask].abs().max() < 1e-5
    logits = _step_logits(model, batch)
    chosen = logits.gather(-1, batch["responses"][..., None])[..., 0]  # (B, T)
    rank = (logits > chosen[..., None]).sum(-1)  # how many tokens beat the sampled one
    if top_k:
        assert rank[mask].max() < top_k
    if (top_k, top_p) == (0, 1.0):  # the folder's top_k=3 was not applied
        assert rank[mask].max() >= 3
    assert (recomputed[mask] < -0.5).float().mean() > 0.1  # real choices were made (the checks mean something)


def test_greedy_and_batch_fields_match_across_backends(spread_model):
    model, tok = spread_model
    assert lean_supported(model)
    # A second stop token that some greedy rows emit and others never do: rows end at different
    # steps (lean drops them) and some run to T.
    prompts = _prompts(tok, ("1+2=", "13+4=", "abc", "xyz?", "7*8=", "55", "Q:", "9-3="))
    plain = _rollout("hf", model, tok).generate(prompts, n=1, greedy=True)["responses"]
    rows_with = torch.stack([(plain == v).any(-1).sum() for v in range(len(tok))])  # (V,)
    stop = int((rows_with - len(plain) / 2).abs().argmin())
    model.generation_config.eos_token_id = [tok.eos_token_id, stop]
    try:
        hf, lean = (_rollout(b, model, tok).generate(prompts, n=1, greedy=True) for b in BACKENDS)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id
    logits = _step_logits(model, hf)
    top2 = logits.topk(2, dim=-1).values
    mask = hf["response_mask"].bool()
    assert (top2[..., 0] - top2[..., 1])[mask].min() > 1e-3  # greedy is not decided by float noise here
    assert sorted(hf.keys()) == sorted(lean.keys()) and hf.meta == lean.meta
    for k in hf.tensors:
        if k == "rollout_log_probs":
            torch.testing.assert_close(hf[k], lean[k], atol=1e-5, rtol=0)
        else:
            assert torch.equal(hf[k], lean[k]), k
    assert 0 < int(hf["truncated"].sum()) < len(hf)  # some rows stopped early, some ran to T
    short = ~hf["truncated"]
    assert (hf["response_mask"][short].sum(-1) < T).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ignore_eos_runs_every_row_to_the_limit(spread_model, backend):
    model, tok = spread_model
    model.generation_config.eos_token_id = list(range(len(tok)))  # every token would stop a row
    try:
        out = _rollout(backend, model, tok, ignore_eos=True).generate(_prompts(tok), n=2, temperature=1.0)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id
    assert out["response_mask"].all() and out["truncated"].all()
    # every position was sampled (lean leaves 0 at the positions of a row it dropped; the spread
    # model gives no token probability 1, so a sampled one has a negative log-prob)
    assert (out["rollout_log_probs"] < 0).all()


def test_lean_falls_back_to_generate_for_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    from reinforge.tasks import build_char_tokenizer

    tok = build_char_tokenizer()
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                       bos_token_id=tok.bos_token_id))
    rollout = _rollout("lean", model, tok)
    assert not rollout.lean
    out = rollout.generate(_prompts(tok), n=2, temperature=1.0)
    assert out["responses"].shape == (8, T) and out.meta["top_k"] == 0
    recomputed, _ = batch_log_probs(model, out, ModelConfig(), 8, 0, False)
    mask = out["response_mask"].bool()
    assert (recomputed - out["rollout_log_probs"])[mask].abs().max() < 1e-5


def test_lean_decodes_through_lora_layers(spread_model):
    """With a LoRA adapter (non-zero B), lean reads the wrapped layers: the same greedy tokens as
    generate(), and sampled log-probs equal to the adapted actor's."""
    import copy

    from reinforge.models.lora import apply_lora

    model, tok = spread_model
    lora = apply_lora(copy.deepcopy(model), 4, 8, ["q_proj", "v_proj", "up_proj"])
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    hf, lean = (_rollout(b, lora, tok).generate(_prompts(tok), n=1, greedy=True) for b in BACKENDS)
    plain = _rollout("lean", model, tok).generate(_prompts(tok), n=1, greedy=True)
    assert torch.equal(hf["responses"], lean["responses"])
    assert (lean["rollout_log_probs"] - plain["rollout_log_probs"]).abs().max() > 0.1  # the adapter matters
    torch.testing.assert_close(hf["rollout_log_probs"], lean["rollout_log_probs"], atol=1e-5, rtol=0)
    torch.manual_seed(0)
    sampled = _rollout("lean", lora, tok, top_k=5).generate(_prompts(tok), n=4, temperature=0.8)
    recomputed, _ = batch_log_probs(lora, sampled, ModelConfig(), 16, 0, False)
    mask = sampled["response_mask"].bool()
    assert (recomputed - sampled["rollout_log_probs"])[mask].abs().max() < 1e-5
