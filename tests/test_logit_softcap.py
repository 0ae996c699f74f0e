"""Models that transform their LM head's output (Gemma-2's final_logit_softcapping, Cohere's
logit_scale, Granite's logits_scaling): the paths that compute logits from the head's weight
themselves (fused log-probs, GKD's chunked JSD) apply the same transform, checked against the
model's own logits on tiny models built from config; a scaling key whose meaning is not known
for the model type is refused."""
from __future__ import annotations

import math

import pytest
import torch

from reinforge.algos.distill import chunked_distill_from_hidden, generalized_jsd
from reinforge.algos.fused_logprobs import fused_logprobs_from_hidden
from reinforge.algos.logit_cap import cap_logits
from reinforge.models.checks import ModelLoadError, logit_transform
from reinforge.models.forward import response_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread

V, H = 64, 16
SMALL = dict(vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def test_cap_by_hand():
    z = torch.tensor([3.0, -1.0, 0.0], dtype=torch.float64)
    assert cap_logits(z, 1.0, 2.0).tolist() == pytest.approx([2 * math.tanh(1.5), 2 * math.tanh(-0.5), 0.0], abs=1e-15)
    assert cap_logits(z, 0.5, 0.0).tolist() == [1.5, -0.5, 0.0]
    assert cap_logits(z, 0.5, 2.0).tolist() == pytest.approx([2 * math.tanh(0.75), 2 * math.tanh(-0.25), 0.0],
                                                             abs=1e-15)  # scale first, then the cap


@pytest.mark.parametrize("scale, cap", [(1.0, 2.0), (0.5, 0.0), (3.0, 1.5)])
def test_fused_matches_transformed_logits_and_gradcheck(scale, cap):
    torch.manual_seed(0)
    N, Hd, Vs = 5, 4, 9
    h = (3 * torch.randn(N, Hd, dtype=torch.float64)).requires_grad_()
    w = torch.randn(Vs, Hd, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, Vs, (N,))
    logp, ent = fused_logprobs_from_hidden(h, w, labels, temperature=0.7, chunk_size=2, return_entropy=True,
                                           logit_scale=scale, logit_softcap=cap)
    ref = (cap_logits(h @ w.T, scale, cap) / 0.7).log_softmax(-1)
    assert torch.allclose(logp, ref.gather(-1, labels[:, None])[:, 0], atol=1e-12)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-12)

    def f(h, w):
        return fused_logprobs_from_hidden(h, w, labels, temperature=0.7, chunk_size=2, return_entropy=True,
                                          logit_scale=scale, logit_softcap=cap)

    assert torch.autograd.gradcheck(f, (h, w))


def test_transform_read_from_config():
    from transformers import CohereConfig, Gemma2Config, GraniteConfig, Qwen2Config

    assert logit_transform(Gemma2Config(final_logit_softcapping=30.0)) == (1.0, 30.0)
    assert logit_transform(Gemma2Config(final_logit_softcapping=None)) == (1.0, 0.0)
    assert logit_transform(CohereConfig(logit_scale=0.0625)) == (0.0625, 0.0)
    assert logit_transform(GraniteConfig(logits_scaling=8.0)) == (0.125, 0.0)  # Granite divides
    assert logit_transform({"model_type": "hyperclovax", "logits_scaling": 8.0}) == (8.0, 0.0)  # HyperCLOVA X multiplies
    assert logit_transform(Qwen2Config()) == (1.0, 0.0)
    assert logit_transform({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
                                                                     "final_logit_softcapping": 30.0}}) == (1.0, 30.0)
    with pytest.raises(ModelLoadError, match=r"model_type 'llama' declares logits_scaling=4\.0, .* set "
                                             r"model\.fused_logprobs=false"):
        logit_transform({"model_type": "llama", "logits_scaling": 4.0})


def _tiny(kind: str):
    """A tiny model of `kind` whose transform changes the log-probs a lot: the head (tied to the
    embeddings) scaled up so raw logits reach ~+-10, against a cap of 3 or a scale of 4."""
    from transformers import (CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM, GraniteConfig,
                              GraniteForCausalLM)

    torch.manual_seed(0)
    if kind == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=3.0))
    elif kind == "cohere":
        model = CohereForCausalLM(CohereConfig(**SMALL, logit_scale=4.0))
    else:
        model = GraniteForCausalLM(GraniteConfig(**SMALL, logits_scaling=0.25))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40.0)
    return model.eval()  # fp32: in fp64, Gemma-2's eager attention turns a left-padded row into NaN


@pytest.mark.parametrize("kind", ["gemma2", "cohere", "granite"])
def test_fused_path_equals_the_model_s_own_logits(kind):
    model = _tiny(kind)
    torch.manual_seed(1)
    ids = torch.randint(3, V, (2, 7))
    am = torch.ones_like(ids)
    am[1, :2] = 0  # a left-padded prompt
    T = 4
    fused, f_ent = response_logprobs(model, ids, am, T, temperature=0.8, with_entropy=True, fused=True)
    own, o_ent = response_logprobs(model, ids, am, T, temperature=0.8, with_entropy=True, fused=False)
    # the logits path reads model(...).logits, transform included: the reference here
    from reinforge.models.forward import position_ids_from_mask

    logits = model(input_ids=ids, attention_mask=am, position_ids=position_ids_from_mask(am)).logits
    by_hand = (logits[:, -T - 1:-1] / 0.8).log_softmax(-1).gather(-1, ids[:, -T:, None])[..., 0]
    assert torch.allclose(own, by_hand, atol=1e-6)
    assert torch.allclose(fused, own, atol=2e-5) and torch.allclose(f_ent, o_ent, atol=2e-5)
    # the transform matters here: without it the log-probs differ by far more than the tolerance
    raw = model.model(input_ids=ids, attention_mask=am, position_ids=position_ids_from_mask(am)).last_hidden_state
    untransformed = (model.get_output_embeddings()(raw)[:, -T - 1:-1] / 0.8).log_softmax(-1)
    assert (untransformed.gather(-1, ids[:, -T:, None])[..., 0] - own).abs().max() > 0.1

    def grads(fused: bool) -> torch.Tensor:
        model.zero_grad()
        lp, ent = response_logprobs(model, ids, am, T, temperature=0.8, with_entropy=True, fused=fused)
        (lp.sum() + 0.1 * ent.sum()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    g_fused, g_own = grads(True), grads(False)
    assert (g_fused - g_own).norm() <= 1e-5 * g_own.norm()


def test_gkd_applies_each_model_s_transform():
    """GKD's chunked JSD from hidden states equals the JSD of the two models' own logits: a
    soft-capped student against a scaled teacher."""
    student, teacher = _tiny("gemma2"), _tiny("cohere")
    torch.manual_seed(2)
    ids = torch.randint(3, V, (2, 6))
    hs = student.model(input_ids=ids).last_hidden_state.reshape(-1, H)
    ht = teacher.model(input_ids=ids).last_hidden_state.reshape(-1, H)
    labels = ids.reshape(-1)
    jsd, logp, _ = chunked_distill_from_hidden(hs, student.get_output_embeddings().weight, ht,
                                               teacher.get_output_embeddings().weight, labels, 0.5, 0.9, 5,
                                               student_cap=logit_transform(student.config),
                                               teacher_cap=logit_transform(teacher.config))
    zs = student(input_ids=ids).logits.reshape(-1, V) / 0.9
    zt = teacher(input_ids=ids).logits.reshape(-1, V) / 0.9
    assert torch.allclose(jsd, generalized_jsd(zs, zt, 0.5), atol=2e-5)
    assert torch.allclose(logp, zs.log_softmax(-1).gather(-1, labels[:, None])[:, 0], atol=2e-5)
    assert generalized_jsd(zs, zt, 0.5).mean() > 0.05  # the two models' distributions are far apart


def test_unknown_scaling_refused_before_any_model_loads(tiny_model_dir, arith_data, tmp_path, no_model_loads):
    import json
    import shutil

    from reinforge.config.load import load_config
    from reinforge.config.preference import DPOConfig
    from reinforge.trainers.plan import resolve_supervised

    folder = tmp_path / "scaled"
    shutil.copytree(tiny_model_dir, folder)
    cfg_json = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg_json, "logits_scaling": 4.0}))  # qwen2 has no such key
    overrides = [f"model.path={folder}", f"data.train_files=[{arith_data['prefs']}]", "trainer.device=cpu"]
    with pytest.raises(ModelLoadError, match=r"^model.path: model_type 'qwen2' declares logits_scaling=4\.0"):
        resolve_supervised(load_config(DPOConfig, "dpo", overrides))
    # the model's own forward applies what it applies: the logits path is not refused
    resolve_supervised(load_config(DPOConfig, "dpo", [*overrides, "model.fused_logprobs=false"]))
