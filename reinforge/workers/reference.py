"""The reference policy: a frozen copy of the initial actor, used for the KL term."""
from __future__ import annotations

import contextlib

from reinforge.config.schema import ModelConfig
from reinforge.models.lora import is_peft
from reinforge.protocol import Batch
from reinforge.workers.actor import batch_log_probs


class ReferenceWorker:
    """A FrozenRole (workers/role.py). `model` is a frozen causal LM, or the actor itself
    wrapped by PEFT (then the adapter is disabled for the reference pass: the base weights are
    the reference, no second copy)."""

    def __init__(self, model, model_cfg: ModelConfig, micro_batch_size: int, max_tokens_per_micro_batch: int = 0):
        self.model, self.mcfg, self.micro_batch_size = model, model_cfg, micro_batch_size
        self.max_tokens = max_tokens_per_micro_batch

    def log_probs(self, batch: Batch) -> Batch:
        """-> ref_log_probs (B, T) at the rollout temperature, micro-batched like the actor."""
        ctx = self.model.disable_adapter() if is_peft(self.model) else contextlib.nullcontext()
        with ctx:
            logp, _ = batch_log_probs(self.model, batch, self.mcfg, self.micro_batch_size, self.max_tokens, False)
        return Batch({"ref_log_probs": logp})

    def close(self) -> None:
        """Nothing to release (workers/role.FrozenRole): the model lives in this process."""
