"""Multi-turn batches through the training math on the tiny model: observation tokens carry no
gradient, the trainer's log-probs and loss equal a hand loop over the same tokens, greedy
episodes agree between the lean and hf engines; and a tiny GRPO run with a tool, resumed."""
from __future__ import annotations

import pytest
import torch

from reinforge.agents.base import Tool, ToolCall
from reinforge.agents.loop import AgentRollout
from reinforge.algos.aggregation import AGG_MODES, agg_denominators, agg_loss
from reinforge.algos.policy_loss import POLICY_LOSSES
from reinforge.config.schema import ActorConfig, ModelConfig
from reinforge.models.forward import response_logprobs
from reinforge.models.loading import load_causal_lm
from reinforge.protocol import Batch
from reinforge.tasks import build_char_tokenizer
from reinforge.trainers.validation import prompts_batch
from reinforge.workers.actor import ActorWorker
from reinforge.workers.rollout.hf import HFRollout
from reinforge.workers.rollout.lean import LeanRollout

pytestmark = pytest.mark.usefixtures("one_thread")
P, T = 8, 24
STOPS = list("aeiouAEIOU0123456789")  # a random character model ends a turn every ~5 tokens
ECHO = Tool("echo", "doubles its text", {"type": "object", "properties": {"x": {"type": "string"}}}, fn=lambda x: x * 2)


class LetterParser:
    """A turn ends at any character of STOPS, which is a call of `echo` on it; the result is
    appended as `[result]`. Turns are short with an untrained model, so every batch has holes."""

    def stop_strings(self, tools):
        return STOPS

    def parse(self, text, tools):
        return [ToolCall("echo", {"x": text[-1]})] if text and text[-1] in STOPS else []

    def observation_ids(self, tok, messages, turn_text):
        return tok("".join(f"[{m['content']}]" for m in messages), add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    tok = build_char_tokenizer()
    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
    items = [{"prompt_ids": tok(p)["input_ids"], "prompt_text": p, "ground_truth": "0"} for p in ("1+2=", "3*4=", "x")]
    torch.manual_seed(0)
    loop = AgentRollout(LeanRollout(model, tok, max_prompt_length=P, max_response_length=T), tok, max_turns=4,
                        parser=LetterParser(), tools={"echo": ECHO})
    batch = loop.generate(prompts_batch(items, 0), n=3)
    holes = (batch["attention_mask"][:, P:] - batch["response_mask"]).sum()
    assert holes > 0 and any(t["turns"] > 1 for t in batch["trajectory"]), "no observation tokens: the test is vacuous"
    return tok, model, items, batch


def _hand_log_probs(model, batch) -> torch.Tensor:
    """(B, T) each generated token's log-prob from a forward over exactly the tokens before it
    (the real prompt, then every response token, observations included), no padding at all."""
    out = torch.zeros(batch["responses"].shape)
    with torch.no_grad():
        for i in range(len(batch)):
            prompt = batch["prompts"][i][batch["attention_mask"][i, :P].bool()]
            for t in batch["response_mask"][i].nonzero()[:, 0].tolist():
                seq = torch.cat([prompt, batch["responses"][i, :t]])[None]
                logits = model(input_ids=seq).logits[0, -1].float()
                out[i, t] = logits.log_softmax(-1)[batch["responses"][i, t]]
    return out


def test_trainer_log_probs_equal_a_hand_loop_and_the_rollouts(setup):
    tok, model, _, batch = setup
    hand = _hand_log_probs(model, batch)
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        lp, _ = response_logprobs(model, batch["input_ids"], batch["attention_mask"], T)
    assert torch.allclose(lp[mask], hand[mask], atol=1e-5)
    assert torch.allclose(batch["rollout_log_probs"][mask], hand[mask], atol=1e-4)


def test_actor_loss_equals_the_hand_loss(setup):
    """PPO-clip, token-mean, old log-probs off the current ones: the actor's micro-batch loss
    equals the loss written out by hand from the hand loop's log-probs."""
    tok, model, _, batch = setup
    mask = batch["response_mask"].float()
    g = torch.Generator().manual_seed(1)
    adv = torch.randn(mask.shape, generator=g)
    hand = _hand_log_probs(model, batch)
    old = hand + 0.3 * torch.randn(mask.shape, generator=g)
    mb = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
    mb["advantages"], mb["old_log_probs"] = adv, old
    actor = ActorWorker(model, ActorConfig(), ModelConfig(), total_steps=1, mini_batch_size=len(batch),
                        micro_batch_size=len(batch), loss_norm_const=1.0, seed=0)
    loss, _ = actor._micro_loss(mb, agg_denominators(mask), 1.0)
    ratio = (hand - old).exp()
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    want = (per_token * mask).sum() / mask.sum()
    assert torch.allclose(loss.detach(), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_observation_positions_get_exactly_zero_gradient(setup, name):
    tok, model, _, batch = setup
    mask = batch["response_mask"].float()
    obs = (batch["attention_mask"][:, P:] - batch["response_mask"]).bool()
    g = torch.Generator().manual_seed(2)
    lp = (torch.randn(mask.shape, generator=g) * 0.5 - 1.0).requires_grad_()
    old = lp.detach() + 0.2 * torch.randn(mask.shape, generator=g)
    adv = torch.randn(mask.shape, generator=g)
    fn = POLICY_LOSSES[name]
    kw = POLICY_LOSSES.entry(name).kwargs(generator=torch.Generator().manual_seed(0))
    for mode in AGG_MODES:
        loss_mat, _ = fn(lp, old, adv, mask, **kw)
        (grad,) = torch.autograd.grad(agg_loss(loss_mat, mask, mode), lp)
        assert torch.count_nonzero(grad[obs]) == 0, (name, mode)
        assert torch.count_nonzero(grad[mask.bool()]) > 0, (name, mode)


def test_advantages_on_observations_do_not_move_the_weights(setup):
    """The model's gradient through the real actor loss is bit-identical whatever advantages
    and old log-probs the observation positions hold."""
    tok, model, _, batch = setup
    mask = batch["response_mask"].float()
    obs = (batch["attention_mask"][:, P:] - batch["response_mask"]).bool()
    actor = ActorWorker(model, ActorConfig(), ModelConfig(), total_steps=1, mini_batch_size=len(batch),
                        micro_batch_size=len(batch), loss_norm_const=1.0, seed=0)
    grads = []
    for junk in (0.0, 1e3):
        mb = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        mb["advantages"] = torch.linspace(-1, 1, mask.numel()).view(mask.shape).masked_fill(obs, junk)
        mb["old_log_probs"] = torch.full(mask.shape, -2.0).masked_fill(obs, junk)
        model.zero_grad()
        actor._micro_loss(mb, agg_denominators(mask), 1.0)[0].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    model.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_greedy_episodes_agree_between_lean_and_hf(setup):
    """The lean engine stops rows at a stop string itself; generate() runs on and the loop cuts:
    greedy episodes are the same tokens either way."""
    tok, model, items, _ = setup
    outs = [AgentRollout(cls(model, tok, max_prompt_length=P, max_response_length=T), tok, max_turns=4,
                         parser=LetterParser(), tools={"echo": ECHO}).generate(prompts_batch(items, 0), n=1, greedy=True)
            for cls in (LeanRollout, HFRollout)]
    for k in ("responses", "response_mask", "attention_mask"):
        assert torch.equal(outs[0][k], outs[1][k]), k
    assert torch.allclose(outs[0]["rollout_log_probs"], outs[1]["rollout_log_probs"], atol=1e-4)
    assert [t["turn_ends"] for t in outs[0]["trajectory"]] == [t["turn_ends"] for t in outs[1]["trajectory"]]
