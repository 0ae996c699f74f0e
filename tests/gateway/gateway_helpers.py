"""Shared pieces of the gateway tests: the tiny model's lean engine, a gateway over it, and an
engine that emits scripted ids (with the real model's log-probs) for tool-call turns."""
from __future__ import annotations

import torch

from reinforge.algos.logprobs import sampling_log_probs


def tiny_engine(model_dir: str, T: int = 48):
    from transformers import AutoModelForCausalLM

    from reinforge.models.loading import load_tokenizer
    from reinforge.workers.rollout.lean import LeanRollout

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return LeanRollout(model, tok, max_prompt_length=32, max_response_length=T), tok


def model_log_probs(model, context: list[int], sampled: list[int], sampling=(1.0, 0, 1.0)) -> torch.Tensor:
    """The trainer's recomputation: each sampled id's log-prob after context + the ids before it."""
    ids = torch.as_tensor([context + sampled])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(context) - 1:-1].float()
    return sampling_log_probs(logits, *sampling).gather(-1, torch.as_tensor(sampled)[:, None])[:, 0]


class ScriptedEngine:
    """continue_ids that "samples" the next scripted turn (a list of ids per call, in order), with
    the wrapped lean engine's model scoring them: a policy that calls a tool on cue."""

    def __init__(self, engine, script: list[list[int]]):
        self.inner, self.script = engine, list(script)
        self.T, self.eos_ids, self.top_k, self.micro_batch_size = engine.T, engine.eos_ids, 0, 64
        self.contexts: list[list[int]] = []

    def continue_ids(self, contexts, max_new, *, greedy, sampling, stop=None):
        out = torch.full((len(contexts), max_new), self.inner.tok.pad_token_id)
        logp = torch.zeros(len(contexts), max_new)
        for r, ctx in enumerate(contexts):
            ids = self.script.pop(0)[:max_new]
            self.contexts.append(list(ctx))
            out[r, :len(ids)] = torch.as_tensor(ids)
            logp[r, :len(ids)] = model_log_probs(self.inner.model, list(ctx), ids, sampling)
        return out, logp
