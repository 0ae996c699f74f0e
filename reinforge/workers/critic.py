"""The critic: values V(s_t) for every response token, and the clipped value-loss update (the one
update loop of workers/update_loop.py over one loss term). Rows of image prompts (a `vision`
field) go through the vision-language value model's forward, with the same image inputs and
M-RoPE positions as the actor's (models/vlm_critic.py), in both the values and the update."""
from __future__ import annotations

import torch

from reinforge.algos.aggregation import agg_denominators
from reinforge.algos.value_loss import clipped_value_loss, explained_variance_from_moments, explained_variance_moments
from reinforge.config.schema import CriticConfig
from reinforge.models.forward import response_values
from reinforge.models.packing import packed_response_values
from reinforge.protocol import Batch
from reinforge.workers.actor import model_device
from reinforge.workers.optim import make_optimizer, make_scheduler
from reinforge.workers.role import LocalTrainedRole
from reinforge.workers.update_loop import LossTerm, NonFiniteGuard, Optim, map_micro_batches, rl_mini_batches, run_update


class CriticWorker(LocalTrainedRole, role="critic"):
    def __init__(self, model, cfg: CriticConfig, *, total_steps: int, mini_batch_size: int, micro_batch_size: int,
                 seed: int, use_packing: bool = False):
        self.model, self.cfg, self.use_packing = model, cfg, use_packing
        self.mini_batch_size, self.micro_batch_size = mini_batch_size, micro_batch_size
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params, cfg.lr, cfg.weight_decay, cfg.betas)
        self.sched = make_scheduler(self.opt, cfg.warmup_steps, total_steps, cfg.lr_schedule)
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps, "critic")
        self.optim = Optim(self.params, self.opt, cfg.grad_clip, self.guard)

    def _values(self, mb: Batch) -> torch.Tensor:
        if "vision" in mb:  # image prompts: the padded forward (packed rows carry no image inputs here)
            return response_values(self.model, mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1],
                                   vision=mb["vision"])
        fn = packed_response_values if self.use_packing else response_values
        return fn(self.model, mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1])

    @torch.no_grad()
    def values(self, batch: Batch) -> Batch:
        """-> values (B, T) on the CPU: the critic's estimate before each response token."""
        (vals,) = map_micro_batches(self.model, batch, self.micro_batch_size, self.cfg.max_tokens_per_micro_batch,
                                    lambda mb: (self._values(mb),))
        return Batch({"values": vals * batch["response_mask"]})

    def _value_loss(self, vpreds: torch.Tensor, mb: Batch, denom: dict) -> tuple[torch.Tensor, dict]:
        c, mask = self.cfg, mb["response_mask"].float()
        loss, m = clipped_value_loss(vpreds, mb["values"], mb["returns"], mask, c.cliprange_value, c.loss_agg_mode,
                                     num_tokens=denom["num_tokens"], num_seqs=denom["num_seqs"])
        return loss, {**m, "vpred_mean": (vpreds.detach() * mask).sum() / mask.sum().clamp(min=1)}

    def loss_terms(self) -> list[LossTerm]:
        """The clipped value loss; the explained variance of each whole mini-batch comes from
        moments summed over its micro-batches and ranks, so it does not depend on the split."""
        return [LossTerm("vf_loss", 1.0, self._value_loss,
                         moments=lambda vpreds, mb: explained_variance_moments(vpreds.detach(), mb["returns"],
                                                                               mb["response_mask"].float()),
                         summary=lambda s: {"vf_explained_var": explained_variance_from_moments(s)})]

    def update(self, batch: Batch) -> dict[str, float]:
        """Regress values on `returns` with the clipped loss. Returns `critic/...` metrics."""
        c = self.cfg
        self.model.train()
        minis = rl_mini_batches(batch, self.mini_batch_size, c.ppo_epochs, True, self.gen, self.micro_batch_size,
                                c.max_tokens_per_micro_batch, model_device(self.model),
                                lambda mini: agg_denominators(mini["response_mask"].float()))
        res = run_update(minis, self.loss_terms(), forward=self._values, optim=self.optim)
        self.sched.step()
        out = res.metrics("critic/")
        out["critic/lr"] = self.sched.get_last_lr()[0]
        return out
