"""The actor's per-token sum of pi^2 over the vocabulary, for estimators in
`algos.advantages.NEEDS_TOKEN_STATS` (the optimal token baseline).

A separate no-grad forward through the model's logits: the fused log-prob path never forms
them. It runs only when such an estimator is configured (one extra forward of the batch).
"""
from __future__ import annotations

import torch

from reinforge.algos.token_stats import sum_pi_squared_from_logits
from reinforge.config.schema import ModelConfig
from reinforge.models.forward import as_root_forward, position_ids_from_mask
from reinforge.protocol import Batch
from reinforge.workers.update_loop import map_micro_batches


def batch_sum_pi_squared(model, batch: Batch, mcfg: ModelConfig, micro_batch_size: int,
                         max_tokens: int) -> torch.Tensor:
    """-> (B, T) fp32 on the CPU: sum_v pi_v^2 at each response position, under the rollout's
    temperature and top-k / top-p (the distribution `old_log_probs` are taken under)."""
    temperature = batch.meta.get("temperature", 1.0)
    top_k, top_p = batch.meta.get("top_k", 0), batch.meta.get("top_p", 1.0)

    def run(mb: Batch) -> tuple[torch.Tensor]:
        ids, am, T = mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1]

        def logits_of(**fwd):
            return model(**fwd, use_cache=False).logits[:, -T - 1:-1]  # (b, T, V): rows predicting the response

        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=mcfg.autocast == "bf16"):
            logits = as_root_forward(model, logits_of, input_ids=ids, attention_mask=am,
                                     position_ids=position_ids_from_mask(am))
        s = sum_pi_squared_from_logits(logits.reshape(-1, logits.shape[-1]), temperature, top_k, top_p)
        return (s.view(len(ids), T),)

    return map_micro_batches(model, batch, micro_batch_size, max_tokens, run)[0]
