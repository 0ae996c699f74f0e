"""The pretrained SmolLM2-135M-Instruct (llama, 30 layers, tied embeddings, ChatML template;
models/pretrained.py) on the real engine: it answers a chat prompt and stops at the template's
end of turn (<|im_end|>, not the tokenizer's EOS alone), the rollout's masks end there, its
log-probs are the trainer's, and after a weight change and sync they still are."""
from __future__ import annotations

import gc

import pytest
import torch

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

from tests.vllm_real.conftest import ENGINE_KW, perturb, prompt_batch  # noqa: E402

QUESTIONS = ["What is 12 times 7?", "Name one colour of the sky."]
T = 32


def test_smollm2_stops_at_the_chat_templates_turn_end(smollm2_folder):
    from reinforge.models.forward import response_logprobs
    from reinforge.models.loading import load_causal_lm, load_tokenizer
    from reinforge.workers.rollout.vllm import VLLMRollout

    folder = str(smollm2_folder)
    tok, model = load_tokenizer(folder), load_causal_lm(folder, dtype="float32")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
               for q in QUESTIONS]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    gc.collect()
    r = VLLMRollout(model, tok, max_prompt_length=max(map(len, prompts)), max_response_length=T,
                    model_path=folder, seed=1, **ENGINE_KW)
    try:
        assert im_end in r.eos_ids
        b = r.generate(prompt_batch(prompts), n=1, greedy=True)
        with torch.no_grad():
            lp, _ = response_logprobs(model, b["input_ids"], b["attention_mask"], T, fused=False)
        m = b["response_mask"].bool()
        assert float((lp - b["rollout_log_probs"])[m].abs().max()) < 1e-4
        stopped = 0
        for row, mask, trunc in zip(b["responses"], b["response_mask"], b["truncated"]):
            k = int(mask.sum())
            if not trunc:  # ended at a stop token: the last kept token is it, nothing generated after
                assert int(row[k - 1]) in r.eos_ids and (row[k:] == tok.pad_token_id).all()
                stopped += int(row[k - 1]) == im_end
        print("answers:", [tok.decode(x[:int(mk.sum())]) for x, mk in zip(b["responses"], b["response_mask"])])
        assert stopped >= 1, "no answer ended at <|im_end|>"
        perturb(model, seed=9, scale=0.05)
        r.sync_weights(model)
        b = r.generate(prompt_batch(prompts), n=2, temperature=1.0, seeds=[1, 2])
        with torch.no_grad():
            lp, _ = response_logprobs(model, b["input_ids"], b["attention_mask"], T, fused=False)
        m = b["response_mask"].bool()
        gap = float((lp - b["rollout_log_probs"])[m].abs().max())
        print(f"SmolLM2 fp32 after a sync: max |gap| {gap:.2e}")
        assert gap < 1e-4, gap
    finally:
        r.close()
        gc.collect()
