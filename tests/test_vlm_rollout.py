"""Rollout of image prompts (lean loop and HF generate): the sampled tokens' log-probs equal the
trainer's recomputation, and the vision encoder runs once per prompt, not per sample."""
import pytest
import torch
from PIL import Image

from reinforge.models.forward import response_logprobs
from reinforge.models.packing import packed_response_logprobs
from reinforge.models.vlm_forward import EncoderCounter
from reinforge.models.vlm_inputs import encode_prompt
from reinforge.protocol import Batch
from reinforge.workers.rollout.hf import HFRollout
from reinforge.workers.rollout.lean import LeanRollout

P, T, N = 40, 8, 3


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vlm(request):
    from reinforge.models.vlm_tiny import make_tiny_vlm

    model, proc = make_tiny_vlm(hidden_size=64, num_layers=2, seed=2, family=request.param)
    return model, proc


@pytest.fixture(scope="module")
def prompts(vlm):
    _, proc = vlm
    img = {"type": "image"}
    rows = [([{"role": "user", "content": [img, {"type": "text", "text": "Count?"}]}], [Image.new("RGB", (56, 84), "red")]),
            ([{"role": "user", "content": "no image here"}], None),
            ([{"role": "user", "content": [{"type": "text", "text": "x"}, img, img]}],
             [Image.new("RGB", (84, 56), "blue"), Image.new("RGB", (56, 56), "white")])]
    enc = [encode_prompt(proc, m, i) for m, i in rows]
    return Batch({"uid": torch.arange(3)}, {"prompt_ids": [e[0] for e in enc], "vision": [e[1] for e in enc]})


@pytest.mark.parametrize("backend", [LeanRollout, HFRollout])
def test_rollout_logprobs_equal_recomputation_and_encoder_once_per_prompt(vlm, prompts, backend):
    model, proc = vlm
    rollout = backend(model, proc.tokenizer, max_prompt_length=P, max_response_length=T)
    if backend is LeanRollout:
        assert rollout.lean  # the lean loop drives Qwen2-VL's language model itself
    torch.manual_seed(0)
    counter = EncoderCounter(model)
    try:
        out = rollout.generate(prompts, n=N, temperature=1.0)
    finally:
        counter.close()
    assert counter.calls == 1 and counter.images == 3  # 3 images of 2 prompts, once for N samples
    assert len(out) == 3 * N and out["vision"][0] is out["vision"][N - 1]  # shared by reference
    mask = out["response_mask"].bool()
    assert mask.sum() > 3 * N  # responses of several tokens
    with torch.no_grad():
        lp, _ = response_logprobs(model, out["input_ids"], out["attention_mask"], T, vision=out["vision"])
    torch.testing.assert_close(out["rollout_log_probs"][mask], lp[mask], atol=1e-5, rtol=0)


def test_lean_greedy_matches_generate(vlm, prompts):
    model, proc = vlm
    kw = dict(max_prompt_length=P, max_response_length=T, ignore_eos=True)
    lean = LeanRollout(model, proc.tokenizer, **kw).generate(prompts, n=1, greedy=True)
    hf = HFRollout(model, proc.tokenizer, **kw).generate(prompts, n=1, greedy=True)
    assert torch.equal(lean["responses"], hf["responses"])


@pytest.mark.parametrize("backend", [LeanRollout, HFRollout])
def test_sampled_image_placeholder_in_a_response_is_text(vlm, prompts, backend):
    """A random policy samples the image placeholder id (1 in ~105 here): the rollout feeds it back
    as a token, so the trainer's recomputation must give it no image feature and text positions,
    and still equal the rollout's log-probs (it used to fail counting image tokens), padded and
    packed alike."""
    model, proc = vlm
    tok_id = model.config.image_token_id
    rollout = backend(model, proc.tokenizer, max_prompt_length=P, max_response_length=24, ignore_eos=True)
    torch.manual_seed(3)
    out = rollout.generate(prompts, n=8, temperature=2.0)
    resp = out["input_ids"][:, -24:]
    assert (resp == tok_id).any()  # the case under test occurs (temperature 2, 576 sampled tokens)
    mask = out["response_mask"].bool()
    with torch.no_grad():
        lp, _ = response_logprobs(model, out["input_ids"], out["attention_mask"], 24, temperature=2.0,
                                  vision=out["vision"])
        packed, _ = packed_response_logprobs(model, out["input_ids"], out["attention_mask"], 24, temperature=2.0,
                                             vision=out["vision"])  # model.use_packing's forward
    torch.testing.assert_close(out["rollout_log_probs"][mask], lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[mask], lp[mask], atol=1e-5, rtol=0)


def test_lean_bf16_decode_with_images_is_the_same_packed_or_not(vlm, prompts):
    """The packed linear weights (the vision tower's too) are cast as they are packed, not in the
    whole-model bf16 copy: tokens and log-probs are those of the unpacked bf16 decode, bit for bit."""
    from reinforge.workers.rollout import packed_linears as pl

    if not pl.available():
        pytest.skip("this torch build has no oneDNN prepacked linear")
    model, proc = vlm
    rollout = LeanRollout(model, proc.tokenizer, max_prompt_length=P, max_response_length=T, ignore_eos=True,
                          dtype="bfloat16")
    out = {}
    for pack in (False, True):
        rollout.pack = pack
        torch.manual_seed(0)
        out[pack] = rollout.generate(prompts, n=2, temperature=1.0)
    assert pl.linear_only_weights(model)  # the packed run did leave the linear weights out of the copy
    assert torch.equal(out[True]["responses"], out[False]["responses"])
    assert torch.equal(out[True]["rollout_log_probs"], out[False]["rollout_log_probs"])
