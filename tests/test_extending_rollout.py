"""docs/extending.md's worked example, "Adding a rollout backend": a naive decoding loop
(one full forward a token, no KV cache) registered under `naive`, checked against the lean loop
and used for one RL step on the tiny model through `rollout.backend=naive`."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from reinforge.algos.logprobs import sampling_log_probs
from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import RLConfig
from reinforge.models.forward import position_ids_from_mask
from reinforge.workers.rollout import ROLLOUT_BACKENDS, RolloutBackend, RolloutCapabilities, register_rollout_backend
from reinforge.workers.rollout.common import assemble_rollout, finish_masks, pad_prompts, sampling_meta, stop_token_ids
from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")
AGENTS = Path(__file__).parent / "gateway" / "gateway_agents.py"


class NaiveRollout:
    """Sampling at a temperature (no top-k / top-p) or greedy, by re-reading the whole sequence
    at every token. Implements the Rollout protocol (workers/rollout/base.py)."""

    capabilities = RolloutCapabilities(continues=False)  # no continue_ids: single-turn runs only
    generator = None  # draws from torch's global generator
    calls = 0  # generate() calls, over all instances (the test reads it)

    def __init__(self, model, tokenizer, *, max_prompt_length: int, max_response_length: int, ignore_eos: bool):
        self.model, self.tok, self.P, self.T, self.ignore_eos = model, tokenizer, max_prompt_length, max_response_length, ignore_eos
        self.eos_ids = stop_token_ids(tokenizer, model)

    @classmethod
    def from_config(cls, model, tokenizer, r, *, max_prompt_length: int):
        """The registry's build: (model, tokenizer, rollout section, max_prompt_length)."""
        if r.top_k or r.top_p < 1.0:
            raise ValueError("the naive backend samples from the whole softmax: set rollout.top_k=0, rollout.top_p=1")
        return cls(model, tokenizer, max_prompt_length=max_prompt_length, max_response_length=r.max_response_length,
                   ignore_eos=r.ignore_eos)

    @torch.no_grad()
    def generate(self, prompts, *, n: int, temperature: float = 1.0, greedy: bool = False):
        ids, mask = pad_prompts(prompts["prompt_ids"], self.P, self.tok.pad_token_id)  # (B0, P)
        meta = sampling_meta(temperature, 0, 1.0, greedy)
        seq, att = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)  # (B, P), samples interleaved
        logps, was_training = [], self.model.training
        self.model.eval()
        try:
            for _ in range(self.T):
                logits = self.model(input_ids=seq, attention_mask=att,
                                    position_ids=position_ids_from_mask(att)).logits[:, -1].float()  # (B, V)
                logp = sampling_log_probs(logits, meta["temperature"], 0, 1.0)
                tok = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1)[:, 0]
                logps.append(logp.gather(-1, tok[:, None])[:, 0])
                seq, att = torch.cat([seq, tok[:, None]], 1), torch.cat([att, torch.ones_like(att[:, :1])], 1)
        finally:
            self.model.train(was_training)
        resp = seq[:, self.P:]  # (B, T): every row ran T tokens
        response_mask, truncated = finish_masks(resp, self.eos_ids, torch.full((len(resp),), self.T), self.ignore_eos)
        resp = resp.masked_fill(response_mask == 0, self.tok.pad_token_id)  # after EOS: padding
        NaiveRollout.calls += 1
        return assemble_rollout(prompts, ids, mask, resp, response_mask, truncated, n, meta,
                                {"rollout_log_probs": torch.stack(logps, 1) * response_mask})

    def continue_ids(self, contexts, max_new, *, greedy, sampling, stop=None):
        raise NotImplementedError("capabilities.continues is False")

    def sync_weights(self, actor_model) -> None:
        """Nothing to do: it generates with the actor's own module."""

    def with_model(self, model) -> "NaiveRollout":
        twin = copy.copy(self)
        twin.model = model
        return twin


@pytest.fixture
def naive_backend():
    register_rollout_backend("naive", RolloutBackend(NaiveRollout.from_config, NaiveRollout.capabilities))
    yield
    del ROLLOUT_BACKENDS["naive"]


def test_naive_greedy_equals_the_lean_loop(naive_backend, tiny_model_dir, arith_data):
    from reinforge.config.schema import RolloutConfig
    from reinforge.data import RLDataset
    from reinforge.models.loading import load_causal_lm, load_tokenizer
    from reinforge.trainers.validation import prompts_batch
    from reinforge.workers.rollout import build_rollout

    tok, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")
    items = [it for _, it in zip(range(6), RLDataset(arith_data["test"], tok, max_prompt_length=8))]
    r = RolloutConfig(max_response_length=6)
    naive, lean = (build_rollout(name, model, tok, r, max_prompt_length=8).generate(prompts_batch(items, 0), n=1, greedy=True)
                   for name in ("naive", "lean"))
    for key in ("responses", "response_mask", "attention_mask", "group_ids", "truncated"):
        assert torch.equal(naive[key], lean[key]), key
    torch.testing.assert_close(naive["rollout_log_probs"], lean["rollout_log_probs"], atol=1e-5, rtol=0)


def test_one_rl_step_on_the_naive_backend(naive_backend, tiny_model_dir, arith_data, tmp_path):
    from reinforge.trainers.rl import RLTrainer

    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "run"), **{
        "rollout.backend": "naive", "trainer.total_steps": 1, "trainer.val_before_train": False,
        "trainer.export_hf": False, "actor.use_kl_loss": False}))
    trainer = RLTrainer(cfg)
    assert isinstance(trainer.rollout, NaiveRollout)
    before = {k: p.detach().clone() for k, p in trainer.actor_model.named_parameters()}
    calls = NaiveRollout.calls
    trainer.fit()
    assert NaiveRollout.calls > calls
    assert any(not torch.equal(before[k], p) for k, p in trainer.actor_model.named_parameters())


def test_the_registry_checks_what_the_backend_declares(naive_backend, tiny_model_dir, arith_data, tmp_path):
    from reinforge.trainers.plan import plan_rl

    def cfg(**extra):
        return load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **extra))

    with pytest.raises(ConfigError, match="rollout.staleness=1 needs rollout.backend=lean"):
        plan_rl(cfg(**{"rollout.backend": "naive", "rollout.staleness": 1}))
    # no continue_ids (capabilities.continues False): neither the agent loop nor the model gateway
    with pytest.raises(ConfigError, match=r"rollout.max_turns=2 continues token prefixes: it runs on the lean or hf "
                                          r"or vllm backend \(got 'naive'\)"):
        plan_rl(cfg(**{"rollout.backend": "naive", "rollout.max_turns": 2, "rollout.tools": "[calculator]"}))
    with pytest.raises(ConfigError, match=r"rollout.agent \(the model gateway\) continues token prefixes"):
        plan_rl(cfg(**{"rollout.backend": "naive", "rollout.agent": f"{AGENTS}:digits"}))
    with pytest.raises(ConfigError, match=r"rollout.backend='navie' is not known; valid: \['hf', 'lean', 'naive'"):
        plan_rl(cfg(**{"rollout.backend": "navie"}))
