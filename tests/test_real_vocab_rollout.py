"""Rollouts with the real Qwen2 vocabulary (a 2-layer Qwen2.5-architecture model): a response
stops where the chat template ends a turn (<|im_end|>) as well as at the tokenizer's EOS
(<|endoftext|>, also the pad token), the masks and log-probs end there, and left-padded
chat-templated prompts score as they would unpadded; lean and hf alike."""
from __future__ import annotations

import pytest
import torch

from reinforge.config.schema import ModelConfig
from reinforge.models.loading import load_causal_lm
from reinforge.protocol import Batch
from reinforge.workers.actor import batch_log_probs
from reinforge.workers.rollout.hf import HFRollout
from reinforge.workers.rollout.lean import LeanRollout

pytestmark = pytest.mark.usefixtures("one_thread")
BACKENDS = {"hf": HFRollout, "lean": LeanRollout}
IM_END, ENDOFTEXT = 151645, 151643
T = 12
QUESTIONS = ("Tom has 3 apples and buys 4 more. How many apples does he have?",
             "What is 6 times 7?", "A train travels 60 km in 1.5 hours. What is its average speed in km/h?")


@pytest.fixture(scope="module")
def model_tok(real_qwen_dir, real_tok):
    model = load_causal_lm(real_qwen_dir)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(3.0)  # tied: spreads the head's logits too
    return model, real_tok("qwen2.5-0.5b")


def _prompts(tok) -> tuple[Batch, int]:
    # As the data pipeline encodes them (reinforge/data/text.py): rendered, then no special tokens added.
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    return Batch({"uid": torch.arange(len(ids))}, {"prompt_ids": ids}), max(map(len, ids))


class ForceStops:
    """Hooks making the model emit <|im_end|> after a token id that is 1 mod 3 and <|endoftext|>
    after one that is 3 mod 7 (logit + 1e4; the prompts end in "\n", id 198, neither): which rows
    stop where depends on what they sample, so the checks below are about structure, not
    positions. Both backends call embed_tokens and lm_head."""

    def __init__(self, model):
        self.last = None
        self.handles = [model.model.embed_tokens.register_forward_pre_hook(self._ids),
                        model.lm_head.register_forward_hook(self._boost)]

    def _ids(self, module, args):
        self.last = args[0][:, -1]

    def _boost(self, module, args, out):
        out = out.clone()
        out[:, -1, IM_END] += 2e4 * (self.last % 3 == 1)
        out[:, -1, ENDOFTEXT] += 1e4 * (self.last % 7 == 3)
        return out

    def remove(self):
        for h in self.handles:
            h.remove()


@pytest.mark.parametrize("backend", BACKENDS)
def test_responses_stop_at_the_turn_end_and_at_eos(model_tok, backend):
    model, tok = model_tok
    assert (tok.eos_token_id, tok.pad_token_id, model.generation_config.eos_token_id) == (ENDOFTEXT,) * 3
    prompts, P = _prompts(tok)
    rollout = BACKENDS[backend](model, tok, max_prompt_length=P, max_response_length=T)
    # A base model's generation config names only <|endoftext|>: <|im_end|> comes from the template.
    assert rollout.eos_ids == [ENDOFTEXT, IM_END]
    torch.manual_seed(0)
    hooks = ForceStops(model)
    try:
        batch = rollout.generate(prompts, n=4, temperature=1.0)
    finally:
        hooks.remove()
    resp, mask, logp = batch["responses"], batch["response_mask"], batch["rollout_log_probs"]
    ends = {IM_END: 0, ENDOFTEXT: 0}
    for r in range(len(resp)):
        stops = [t for t in range(T) if resp[r, t].item() in (IM_END, ENDOFTEXT)]
        if stops:
            k = stops[0]
            ends[resp[r, k].item()] += 1
            assert mask[r].tolist() == [1] * (k + 1) + [0] * (T - k - 1)  # the stop token is trained on
            assert (resp[r, k + 1:] == tok.pad_token_id).all() and (logp[r, k + 1:] == 0).all()
            assert not batch["truncated"][r] and logp[r, k] > -1e-3  # the boosted stop was drawn
        else:
            assert mask[r].all() and batch["truncated"][r]
    assert ends[IM_END] > 0 and ends[ENDOFTEXT] > 0, ends
    assert batch["attention_mask"][:, P:].equal(mask)
    # The trainer scores the same tokens (without the hooks its log-probs differ at the stops only).
    recomputed, _ = batch_log_probs(model, batch, ModelConfig(), 16, 0, False)
    free = mask.bool() & ~torch.isin(resp, torch.tensor([IM_END, ENDOFTEXT]))
    torch.testing.assert_close(recomputed[free], logp[free], atol=1e-4, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_left_padded_chat_prompts_score_as_unpadded(model_tok, backend):
    model, tok = model_tok
    prompts, P = _prompts(tok)
    lengths = [len(p) for p in prompts["prompt_ids"]]
    assert len(set(lengths)) == len(lengths), "the prompts should differ in length"
    torch.manual_seed(1)
    batch = BACKENDS[backend](model, tok, max_prompt_length=P, max_response_length=T).generate(prompts, n=2)
    for r in range(len(batch)):
        L = lengths[r // 2]
        assert batch["prompts"][r, :P - L].eq(tok.pad_token_id).all() and batch["attention_mask"][r, :P].tolist() == \
            [0] * (P - L) + [1] * L
        assert batch["prompts"][r, P - L:].tolist() == prompts["prompt_ids"][r // 2]
        k = int(batch["response_mask"][r].sum())
        alone = torch.tensor([prompts["prompt_ids"][r // 2] + batch["responses"][r, :k].tolist()])
        with torch.no_grad():
            lp = model(input_ids=alone).logits[0, L - 1:-1].float().log_softmax(-1)
        own = lp.gather(-1, batch["responses"][r, :k, None])[:, 0]
        torch.testing.assert_close(batch["rollout_log_probs"][r, :k], own, atol=1e-4, rtol=0)
