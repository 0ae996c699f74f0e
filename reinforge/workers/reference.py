"""The reference policy: a frozen copy of the initial actor, used for the KL term."""
from __future__ import annotations

import contextlib

import torch

from reinforge.config.schema import ModelConfig
from reinforge.models.forward import response_logprobs
from reinforge.models.packing import packed_response_logprobs
from reinforge.protocol import Batch


class ReferenceWorker:
    """`model` is a frozen causal LM, or the actor itself wrapped by PEFT (then the adapter is
    disabled for the reference pass: the base weights are the reference, no second copy)."""

    def __init__(self, model, model_cfg: ModelConfig, micro_batch_size: int):
        self.model, self.mcfg, self.micro_batch_size = model, model_cfg, micro_batch_size

    @torch.no_grad()
    def log_probs(self, batch: Batch) -> Batch:
        """-> ref_log_probs (B, T) at the rollout temperature."""
        temperature = batch.meta.get("temperature", 1.0)
        ctx = self.model.disable_adapter() if hasattr(self.model, "disable_adapter") else contextlib.nullcontext()
        was_training = self.model.training
        self.model.eval()
        out = []
        with ctx:
            for mb in batch.split(self.micro_batch_size):
                fn = packed_response_logprobs if self.mcfg.use_packing else response_logprobs
                lp, _ = fn(self.model, mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1],
                                          temperature=temperature, fused=self.mcfg.fused_logprobs,
                                          chunk_size=self.mcfg.logprob_chunk_size)
                out.append(lp.float())
        self.model.train(was_training)
        return Batch({"ref_log_probs": torch.cat(out)})
