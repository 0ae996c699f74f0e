"""The actor: log-probs of the rollout policy, and the clipped policy-gradient update.

`update` runs ppo_epochs x mini-batches x micro-batches. Each micro-batch loss is aggregated
with the *mini-batch's* token and sequence counts, so the accumulated gradient equals the
gradient of the mini-batch loss exactly, whatever the micro-batch size.

On-policy updates (one epoch, one mini-batch, no dropout: `on_policy_update`) need no separate
old-log-prob forward: the update's own forward runs at the rollout weights, so its detached
log-probs are the old ones (ratio exactly 1) and `update` reports entropy and the reference KL
from that pass. The trainer then leaves `old_log_probs` out of the batch.
"""
from __future__ import annotations

import torch

from reinforge.algos.aggregation import agg_denominators, agg_loss
from reinforge.algos.kl import kl_penalty
from reinforge.algos.masked import masked_mean
from reinforge.algos.policy_loss import get_policy_loss, loss_kwargs
from reinforge.config.schema import ActorConfig, ModelConfig
from reinforge.models.forward import response_logprobs
from reinforge.models.packing import micro_batches, packed_response_logprobs, restore_order
from reinforge.protocol import Batch
from reinforge.workers import dp
from reinforge.workers.gkd import GKDTerm, gkd_log_probs
from reinforge.workers.rollout.vllm import tis_weights
from reinforge.workers.token_stats import batch_sum_pi_squared
from reinforge.workers.optim import (NonFiniteGuard, TrainedWorkerState, clip_and_step, make_optimizer, make_scheduler,
                                     mini_batches)


class MetricSum:
    """Weighted sums of metric tensors, read out as floats once per update (one sync).

    Weights are chosen so that each mini-batch contributes a total weight of one; `result`
    divides by the number of mini-batches.
    """

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, metrics: dict[str, torch.Tensor], weight: float) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + v.detach().float() * weight

    def all_reduce(self) -> "MetricSum":
        """Sum over data-parallel ranks (each rank added its share of the global mini-batch)."""
        if self.sums and dp.world_size() > 1:
            keys = sorted(self.sums)
            flat = dp.all_reduce_sum_(torch.stack([torch.as_tensor(self.sums[k]).float().cpu() for k in keys]))
            self.sums = dict(zip(keys, flat))
        return self

    def result(self, prefix: str, count: int) -> dict[str, float]:
        return {f"{prefix}{k}": float(v) / max(count, 1) for k, v in self.sums.items()}


class ActorWorker(TrainedWorkerState):
    def __init__(self, model, cfg: ActorConfig, model_cfg: ModelConfig, *, total_steps: int,
                 mini_batch_size: int, micro_batch_size: int, loss_norm_const: float, seed: int,
                 on_policy: bool = False, tis_cap: float | None = None):
        self.model, self.cfg, self.mcfg = model, cfg, model_cfg
        self.on_policy, self.tis_cap = on_policy, tis_cap  # the run's plan (trainers/plan.py)
        self.mini_batch_size, self.micro_batch_size = mini_batch_size, micro_batch_size
        self.loss_norm_const = loss_norm_const
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params, cfg.lr, cfg.weight_decay, cfg.betas)
        self.sched = make_scheduler(self.opt, cfg.warmup_steps, total_steps, cfg.lr_schedule)
        self.loss_fn = get_policy_loss(cfg.policy_loss)
        self.gen = torch.Generator().manual_seed(seed)
        # each loss takes only the hyper-parameters it declares; clip_cov draws from self.gen
        self.loss_kw = loss_kwargs(self.loss_fn, clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.clip_c,
                                   tau_pos=cfg.tau_pos, tau_neg=cfg.tau_neg, clip_cov_ratio=cfg.clip_cov_ratio,
                                   clip_cov_lb=cfg.clip_cov_lb, clip_cov_ub=cfg.clip_cov_ub,
                                   kl_cov_ratio=cfg.kl_cov_ratio, ppo_kl_coef=cfg.ppo_kl_coef, dro_beta=cfg.dro_beta,
                                   generator=self.gen)
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps, "actor")
        self.gkd: GKDTerm | None = None  # teacher.mode=gkd: set by trainers/rl_setup.make_teacher

    @torch.no_grad()
    def log_probs(self, batch: Batch, *, with_entropy: bool = True, with_sum_pi_squared: bool = False) -> Batch:
        """-> old_log_probs (B, T) and, optionally, entropy (B, T) and sum_pi_squared (B, T)
        (sum over the vocabulary of pi^2: the optimal token baseline's input; an extra forward)."""
        logp, ent = batch_log_probs(self.model, batch, self.mcfg, self.micro_batch_size,
                                    self.cfg.max_tokens_per_micro_batch, with_entropy)
        out = Batch({"old_log_probs": logp, **({"entropy": ent} if with_entropy else {})})
        if with_sum_pi_squared:
            out["sum_pi_squared"] = batch_sum_pi_squared(self.model, batch, self.mcfg, self.micro_batch_size,
                                                         self.cfg.max_tokens_per_micro_batch)
        return out

    def _micro_loss(self, mb: Batch, denom: dict, temperature: float) -> tuple[torch.Tensor, dict]:
        c = self.cfg
        mask = mb["loss_mask"] if "loss_mask" in mb else mb["response_mask"]
        mask = mask.float()
        need_entropy = c.entropy_coeff != 0
        on_policy = "old_log_probs" not in mb
        if self.gkd is not None:  # the same student forward also gives the JSD to the teacher
            log_probs, entropy, jsd = gkd_log_probs(self.model, self.gkd, mb, temperature, self.mcfg.logprob_chunk_size,
                                                    self.mcfg.autocast == "bf16")
        else:
            log_probs, entropy = micro_log_probs(self.model, mb, self.mcfg, temperature, need_entropy or on_policy)
        old_log_probs = log_probs.detach() if on_policy else mb["old_log_probs"]
        loss_mat, m = self.loss_fn(log_probs, old_log_probs, mb["advantages"], mask, **self.loss_kw)
        if on_policy:  # what trainers/metrics.py reads from the skipped pass's outputs
            resp = mb["response_mask"].float()
            m["entropy"] = masked_mean(entropy.detach(), resp)
            if "ref_log_probs" in mb:
                m["ref_kl"] = masked_mean(old_log_probs - mb["ref_log_probs"], resp)
        if "tis_weight" in mb:  # truncated importance sampling, per token (vLLM, rollout.staleness)
            loss_mat = loss_mat * mb["tis_weight"]
        elif on_policy and "tis_cap" in mb.meta and "rollout_log_probs" in mb:
            # on-policy, this forward's detached log-probs are the old ones: no separate pass needed
            w, tis = tis_weights(old_log_probs, mb["rollout_log_probs"], mb["response_mask"], mb.meta["tis_cap"])
            loss_mat = loss_mat * w
            m.update({k: v for k, v in tis.items() if not k.endswith("_max")})  # means: token-weighted below
        agg = dict(num_tokens=denom["num_tokens"], num_seqs=denom["num_seqs"], norm_const=self.loss_norm_const)
        pg_loss = agg_loss(loss_mat, mask, c.loss_agg_mode, **agg)
        loss = pg_loss
        metrics = {"pg_loss": pg_loss, **m}
        if need_entropy:
            ent_loss = agg_loss(entropy, mask, c.loss_agg_mode, **agg)
            loss = loss - c.entropy_coeff * ent_loss
            metrics["entropy_loss"] = ent_loss
        if self.gkd is not None:
            gkd_loss = agg_loss(jsd, mask, c.loss_agg_mode, **agg)
            loss = loss + self.gkd.coef * gkd_loss
            metrics["gkd_loss"] = gkd_loss
        if c.use_kl_loss:
            kld = kl_penalty(log_probs, mb["ref_log_probs"], c.kl_loss_type)
            kl_loss = agg_loss(kld, mask, c.loss_agg_mode, **agg)
            loss = loss + c.kl_loss_coef * kl_loss
            metrics["kl_loss"] = kl_loss
        return loss, metrics

    def update(self, batch: Batch) -> dict[str, float]:
        """One training step's actor update. Returns `actor/...` metrics.

        Data-parallel: every rank gets the whole batch and trains on its slice of each mini-batch
        (see workers/dp.py); counts and shares are the global mini-batch's, and the loss is
        scaled by the world size because FSDP averages gradients over ranks."""
        temperature = batch.meta.get("temperature", 1.0)
        if "old_log_probs" not in batch and not on_policy_update(self.model, self.cfg.ppo_epochs, self.mini_batch_size,
                                                                 len(batch)):
            raise ValueError("old_log_probs may be left out only for an on-policy update (one epoch, one mini-batch)")
        sums, shared, nonfinite, n_mini = MetricSum(), MetricSum(), 0, 0
        world = dp.world_size()
        tis_metrics = {}
        if "tis_cap" in batch.meta and "rollout_log_probs" in batch and "old_log_probs" in batch:
            w, tis_metrics = tis_weights(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"],
                                         batch.meta["tis_cap"])
            batch = batch | Batch({"tis_weight": w})
        self.model.train()
        device = model_device(self.model)
        for mini in mini_batches(batch, self.mini_batch_size, self.cfg.ppo_epochs, self.cfg.shuffle, self.gen):
            mask = mini["loss_mask"] if "loss_mask" in mini else mini["response_mask"]
            denom = agg_denominators(mask.float())
            mini_tokens = max(float(mini["response_mask"].sum()), 1.0)
            n_mini += 1
            finite = True
            mbs, _ = micro_batches(dp.shard(mini), self.micro_batch_size, self.cfg.max_tokens_per_micro_batch)
            for mb in mbs:
                mb = mb.to(device)
                loss, m = self._micro_loss(mb, denom, temperature)
                if not torch.isfinite(loss):
                    finite = False
                    if world == 1:
                        break  # alone, stop early; in a group every rank must run the same collectives
                (loss * world).backward()
                # Loss-like metrics add up over micro-batches (they were normalised by the
                # mini-batch counts); ratios are token-weighted within the mini-batch.
                share = float(mb["response_mask"].sum()) / mini_tokens
                sums.add({k: v for k, v in m.items() if k.endswith("loss")}, 1.0)
                sums.add({k: v for k, v in m.items() if not k.endswith("loss")}, share)
            if dp.all_true(finite):
                grad_norm, finite = clip_and_step(self.params, self.opt, self.cfg.grad_clip)
                shared.add({"grad_norm": _local(grad_norm)}, 1.0)
            else:
                finite = False
                self.opt.zero_grad(set_to_none=True)
            nonfinite += not finite
            self.guard.record(finite)
        self.sched.step()
        out = {k.removeprefix("actor/") if k.startswith("actor/rollout_corr/") else k: v
               for k, v in {**sums.all_reduce().result("actor/", n_mini), **shared.result("actor/", n_mini)}.items()}
        out.update({k: float(v) for k, v in tis_metrics.items()})
        out["actor/lr"] = self.sched.get_last_lr()[0]
        out["actor/nonfinite_skipped"] = float(nonfinite)
        return out


def on_policy_update(model, ppo_epochs: int, mini_batch_size: int, batch_size: int) -> bool:
    """Whether the actor's update takes its one optimizer step at the rollout weights with the
    forward the old-log-prob pass would run: one epoch, the whole batch (`batch_size` rows at
    most) in one mini-batch, and no dropout (train-mode forward = eval-mode forward). Then the
    update's detached log-probs are the old log-probs and the separate pass can be skipped."""
    dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    dropout = dropout or getattr(getattr(model, "config", None), "attention_dropout", 0.0) > 0
    return ppo_epochs == 1 and batch_size <= mini_batch_size and not dropout


def _local(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (FSDP's global grad norm) as a plain tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def model_device(model) -> torch.device:
    """Where the model's weights live (under FSDP2: this rank's device)."""
    return next(model.parameters()).device


def micro_log_probs(model, mb: Batch, mcfg: ModelConfig, temperature: float, with_entropy: bool):
    """Log-probs (and entropies) (b, T) of one micro-batch already on the model's device, under the
    distribution the rollout sampled from (its top-k / top-p, recorded in the batch's meta)."""
    fn = packed_response_logprobs if mcfg.use_packing else response_logprobs
    with torch.autocast(model_device(model).type, dtype=torch.bfloat16, enabled=mcfg.autocast == "bf16"):
        return fn(model, mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1], temperature=temperature,
                  with_entropy=with_entropy, fused=mcfg.fused_logprobs, chunk_size=mcfg.logprob_chunk_size,
                  top_k=mb.meta.get("top_k", 0), top_p=mb.meta.get("top_p", 1.0))


@torch.no_grad()
def batch_log_probs(model, batch: Batch, mcfg: ModelConfig, micro_batch_size: int, max_tokens: int,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (B, T) fp32 on the CPU, and entropies or None, of a whole batch at its rollout
    temperature: micro-batches (token budget honoured) on the model's device, in eval mode,
    put back in batch order. The actor's old log-probs and the reference's log-probs."""
    temperature = batch.meta.get("temperature", 1.0)
    was_training, device = model.training, model_device(model)
    model.eval()
    logps, ents = [], []
    mbs, order = micro_batches(batch, micro_batch_size, max_tokens)
    for mb in mbs:
        lp, ent = micro_log_probs(model, mb.to(device), mcfg, temperature, with_entropy)
        logps.append(lp.float().cpu())
        ents.append(ent.float().cpu() if ent is not None else None)
    model.train(was_training)
    return (restore_order(torch.cat(logps), order),
            restore_order(torch.cat(ents), order) if with_entropy else None)
