"""The critic: values V(s_t) for every response token, and the clipped value-loss update."""
from __future__ import annotations

import torch

from reinforge.algos.aggregation import agg_denominators
from reinforge.algos.value_loss import clipped_value_loss, explained_variance_from_moments, explained_variance_moments
from reinforge.config.schema import CriticConfig
from reinforge.models.forward import response_values
from reinforge.models.packing import micro_batches, packed_response_values, restore_order
from reinforge.protocol import Batch
from reinforge.workers import dp
from reinforge.workers.actor import MetricSum, _local, model_device
from reinforge.workers.optim import NonFiniteGuard, clip_and_step, make_optimizer, make_scheduler, mini_batches
from reinforge.workers.role import LocalTrainedRole


class CriticWorker(LocalTrainedRole, role="critic"):
    def __init__(self, model, cfg: CriticConfig, *, total_steps: int, mini_batch_size: int, micro_batch_size: int,
                 seed: int, use_packing: bool = False):
        self.model, self.cfg, self.use_packing = model, cfg, use_packing
        self.mini_batch_size, self.micro_batch_size = mini_batch_size, micro_batch_size
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params, cfg.lr, cfg.weight_decay, cfg.betas)
        self.sched = make_scheduler(self.opt, cfg.warmup_steps, total_steps, cfg.lr_schedule)
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.guard = NonFiniteGuard(3, "critic")

    def _values(self, mb: Batch) -> torch.Tensor:
        fn = packed_response_values if self.use_packing else response_values
        return fn(self.model, mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1])

    @torch.no_grad()
    def values(self, batch: Batch) -> Batch:
        """-> values (B, T) on the CPU: the critic's estimate before each response token."""
        self.model.eval()
        device = model_device(self.model)
        mbs, order = micro_batches(batch, self.micro_batch_size, self.cfg.max_tokens_per_micro_batch)
        vals = restore_order(torch.cat([self._values(mb.to(device)).cpu() for mb in mbs]), order)
        self.model.train()
        return Batch({"values": vals * batch["response_mask"]})

    def update(self, batch: Batch) -> dict[str, float]:
        """Regress values on `returns` with the clipped loss. Returns `critic/...` metrics."""
        c = self.cfg
        sums, shared, n_mini, world = MetricSum(), MetricSum(), 0, dp.world_size()
        self.model.train()
        device = model_device(self.model)
        for mini in mini_batches(batch, self.mini_batch_size, c.ppo_epochs, True, self.gen):
            mask = mini["response_mask"].float()  # the global mini-batch (see workers/dp.py)
            denom = agg_denominators(mask)
            n_mini += 1
            moments = MetricSum()
            for mb in micro_batches(dp.shard(mini), self.micro_batch_size, c.max_tokens_per_micro_batch)[0]:
                mb = mb.to(device)
                m_mask = mb["response_mask"].float()
                vpreds = self._values(mb)
                loss, m = clipped_value_loss(vpreds, mb["values"], mb["returns"], m_mask, c.cliprange_value,
                                             c.loss_agg_mode, num_tokens=denom["num_tokens"],
                                             num_seqs=denom["num_seqs"])
                (loss * world).backward()  # FSDP averages gradients over ranks
                share = float(m_mask.sum()) / max(float(mask.sum()), 1.0)
                moments.add(explained_variance_moments(vpreds.detach(), mb["returns"], m_mask), 1.0)
                sums.add({"vf_loss": loss}, 1.0)
                sums.add({**m, "vpred_mean": (vpreds.detach() * m_mask).sum() / m_mask.sum().clamp(min=1)}, share)
            # Explained variance of the whole mini-batch, from moments summed over micro-batches
            # and ranks: it does not depend on how the mini-batch was split.
            shared.add({"vf_explained_var": explained_variance_from_moments(moments.all_reduce().sums)}, 1.0)
            grad_norm, ok = clip_and_step(self.params, self.opt, c.grad_clip)
            self.guard.record(ok)
            shared.add({"grad_norm": _local(grad_norm)}, 1.0)
        self.sched.step()
        out = {**sums.all_reduce().result("critic/", n_mini), **shared.result("critic/", n_mini)}
        out["critic/lr"] = self.sched.get_last_lr()[0]
        return out
