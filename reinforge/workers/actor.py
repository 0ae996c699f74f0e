"""The actor: log-probs of the rollout policy, and the clipped policy-gradient update.

`update` runs ppo_epochs x mini-batches x micro-batches through the one update loop
(workers/update_loop.py) over the actor's loss terms (`loss_terms`: policy loss, entropy bonus,
GKD's JSD, KL loss). Each micro-batch loss is aggregated with the *mini-batch's* token and
sequence counts, so the accumulated gradient equals the gradient of the mini-batch loss exactly,
whatever the micro-batch size.

On-policy updates (one epoch, one mini-batch, no dropout: `on_policy_update`) need no separate
old-log-prob forward: the update's own forward runs at the rollout weights, so its detached
log-probs are the old ones (ratio exactly 1) and `update` reports entropy and the reference KL
from that pass. The worker is told so at construction (`on_policy=True`, decided once by the
run's plan); the trainer then leaves `old_log_probs` out of the batch. Truncated importance
sampling (`tis_cap`, a constructor argument too) weights each token by
min(exp(old - rollout_log_probs), tis_cap) when the batch has `rollout_log_probs`.
"""
from __future__ import annotations

import torch

from reinforge.algos.aggregation import agg_denominators, agg_loss
from reinforge.algos.kl import kl_penalty
from reinforge.algos.moe import load_balancing_loss
from reinforge.algos.masked import masked_mean
from reinforge.algos.policy_loss import POLICY_LOSSES, log_ratio_max
from reinforge.algos.tis import tis_weights
from reinforge.config.schema import ActorConfig, ModelConfig
from reinforge.models.forward import response_logprobs
from reinforge.models.moe import attach_routing, routing_of, select_for
from reinforge.models.packing import packed_response_logprobs
from reinforge.protocol import Batch
from reinforge.workers.gkd import GKDTerm, gkd_log_probs
from reinforge.workers.token_stats import batch_sum_pi_squared
from reinforge.workers.optim import make_optimizer, make_scheduler
from reinforge.workers.role import LocalTrainedRole
from reinforge.workers.update_loop import (LossTerm, NonFiniteGuard, Optim, map_micro_batches, micro_loss,
                                           rl_mini_batches, run_update)


class ActorWorker(LocalTrainedRole, role="actor"):
    def __init__(self, model, cfg: ActorConfig, model_cfg: ModelConfig, *, total_steps: int,
                 mini_batch_size: int, micro_batch_size: int, loss_norm_const: float, seed: int,
                 on_policy: bool = False, tis_cap: float | None = None):
        """on_policy: the update takes its one step at the rollout weights (`on_policy_update`), so
        its own forward gives the old log-probs and the batch brings none. tis_cap: truncated
        importance sampling against the batch's `rollout_log_probs` (vLLM, rollout.staleness)."""
        self.model, self.cfg, self.mcfg = model, cfg, model_cfg
        self.on_policy, self.tis_cap = on_policy, tis_cap
        self.mini_batch_size, self.micro_batch_size = mini_batch_size, micro_batch_size
        self.loss_norm_const = loss_norm_const
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params, cfg.lr, cfg.weight_decay, cfg.betas)
        self.sched = make_scheduler(self.opt, cfg.warmup_steps, total_steps, cfg.lr_schedule)
        loss = POLICY_LOSSES.entry(cfg.policy_loss)
        self.loss_fn = loss.fn
        self.gen = torch.Generator().manual_seed(seed)
        # the loss's own params, read from cfg (its keys); clip_cov also draws from self.gen
        self.loss_kw = loss.kwargs(cfg, generator=self.gen)
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps, "actor")
        self.optim = Optim(self.params, self.opt, cfg.grad_clip, self.guard)
        self.gkd: GKDTerm | None = None  # teacher.mode=gkd: set by trainers/rl_setup.make_teacher
        # MoE policies: hooks on the routers (replay, the aux loss's inputs); None for a dense model
        self.routing = attach_routing(model, replay=cfg.router_replay == "rollout")

    @torch.no_grad()
    def log_probs(self, batch: Batch, *, with_entropy: bool = True, with_sum_pi_squared: bool = False) -> Batch:
        """-> old_log_probs (B, T) and, optionally, entropy (B, T) and sum_pi_squared (B, T)
        (sum over the vocabulary of pi^2: the optimal token baseline's input; an extra forward)."""
        try:
            logp, ent = batch_log_probs(self.model, batch, self.mcfg, self.micro_batch_size,
                                        self.cfg.max_tokens_per_micro_batch, with_entropy,
                                        routed=self.routing is not None)
        finally:
            if self.routing is not None:
                self.routing.clear()
        out = Batch({"old_log_probs": logp, **({"entropy": ent} if with_entropy else {})})
        if with_sum_pi_squared:
            out["sum_pi_squared"] = batch_sum_pi_squared(self.model, batch, self.mcfg, self.micro_batch_size,
                                                         self.cfg.max_tokens_per_micro_batch)
        return out

    # ---- the update: the one loop of workers/update_loop.py over the actor's loss terms --------
    def _forward(self, mb: Batch, temperature: float) -> dict:
        """One student forward of a micro-batch on the device -> what the loss terms read: log_probs
        (b, T) with grad, entropy (b, T) (None when nothing reads it), jsd (b, T) under GKD,
        old_log_probs (on-policy: this forward's, detached) and the loss mask (b, T)."""
        jsd = None
        select_for(self.model, mb, capture=True)  # MoE: replay the rollout's experts; keep the router outputs
        if self.gkd is not None:  # the same student forward also gives the JSD to the teacher
            log_probs, entropy, jsd = gkd_log_probs(self.model, self.gkd, mb, temperature, self.mcfg.logprob_chunk_size,
                                                    self.mcfg.autocast == "bf16")
        else:
            log_probs, entropy = micro_log_probs(self.model, mb, self.mcfg, temperature,
                                                 self.cfg.entropy_coeff != 0 or self.on_policy)
        old_log_probs = log_probs.detach() if self.on_policy else mb["old_log_probs"]
        mask = (mb["loss_mask"] if "loss_mask" in mb else mb["response_mask"]).float()
        router = self.routing.take_captured() if self.routing is not None else None
        return {"log_probs": log_probs, "entropy": entropy, "jsd": jsd, "old_log_probs": old_log_probs, "mask": mask,
                "router": router}

    def _agg(self, x: torch.Tensor, mask: torch.Tensor, denom: dict) -> torch.Tensor:
        """(b, T) -> the term's share of the mini-batch loss (the mini-batch's counts)."""
        return agg_loss(x, mask, self.cfg.loss_agg_mode, num_tokens=denom["num_tokens"], num_seqs=denom["num_seqs"],
                        norm_const=self.loss_norm_const)

    def _policy_loss(self, out: dict, mb: Batch, denom: dict) -> tuple[torch.Tensor, dict]:
        loss_mat, m = self.loss_fn(out["log_probs"], out["old_log_probs"], mb["advantages"], out["mask"], **self.loss_kw)
        # the extreme token the losses' clamps would hide (algos/policy_loss.py); a `_max` metric: reduced by max
        m["log_ratio_max"] = log_ratio_max(out["log_probs"], out["old_log_probs"], out["mask"])
        if self.on_policy:  # what trainers/metrics.py reads from the skipped pass's outputs
            resp = mb["response_mask"].float()
            m["entropy"] = masked_mean(out["entropy"].detach(), resp)
            if "ref_log_probs" in mb:
                m["ref_kl"] = masked_mean(out["old_log_probs"] - mb["ref_log_probs"], resp)
        if "tis_weight" in mb:  # truncated importance sampling, per token, from the old-log-prob pass
            loss_mat = loss_mat * mb["tis_weight"]
        elif self.on_policy and self.tis_cap is not None and "rollout_log_probs" in mb:
            # on-policy, this forward's detached log-probs are the old ones: no separate pass needed
            w, tis = tis_weights(out["old_log_probs"], mb["rollout_log_probs"], mb["response_mask"], self.tis_cap)
            loss_mat = loss_mat * w
            m.update(tis)  # means token-weighted, the `_max` gap a maximum (update_loop.MetricSum)
        return self._agg(loss_mat, out["mask"], denom), m

    def _router_loss(self, out: dict, mb: Batch, denom: dict) -> tuple[torch.Tensor, dict]:
        """MoE: the load-balancing loss of this micro-batch's forward (algos/moe.py: every real token,
        prompts included, as the routers saw them) times its share of the mini-batch's loss tokens,
        so the micro-batches add up to a token-weighted mean over the mini-batch (the loss is not
        additive over tokens: each forward's own, as Megatron computes it per micro-batch)."""
        logits, experts = out["router"]
        att = mb["attention_mask"].reshape(-1)
        # packed rows (model.use_packing): the forward's tokens are the packed slots, all counted
        mask = att if logits[0].shape[0] == att.numel() else torch.ones(logits[0].shape[0], device=logits[0].device)
        if self.cfg.router_aux_loss_coef == 0:  # metrics only: no graph through the routers
            logits = [x.detach() for x in logits]
        aux, m = load_balancing_loss(logits, experts, mask.to(logits[0].device))
        share = _loss_mask(mb).float().sum() / denom["num_tokens"].clamp(min=1.0)
        return aux * share, m

    def loss_terms(self) -> list[LossTerm]:
        """pg_loss - entropy_coeff * entropy (+ coef * GKD's JSD) (+ kl_loss_coef * KL to the
        reference) (+ router_aux_loss_coef * the MoE load-balancing loss, whose metrics an MoE
        policy logs even at coefficient 0), each aggregated like the policy loss; in this order."""
        c = self.cfg
        terms = [LossTerm("pg_loss", 1.0, self._policy_loss)]
        if c.entropy_coeff != 0:
            terms.append(LossTerm("entropy_loss", -c.entropy_coeff,
                                  lambda out, mb, d: (self._agg(out["entropy"], out["mask"], d), {})))
        if self.gkd is not None:
            terms.append(LossTerm("gkd_loss", self.gkd.coef, lambda out, mb, d: (self._agg(out["jsd"], out["mask"], d), {})))
        if c.use_kl_loss:
            terms.append(LossTerm("kl_loss", c.kl_loss_coef, lambda out, mb, d: (
                self._agg(kl_penalty(out["log_probs"], mb["ref_log_probs"], c.kl_loss_type), out["mask"], d), {})))
        if self.routing is not None:
            terms.append(LossTerm("moe_aux_loss", c.router_aux_loss_coef, self._router_loss))
        return terms

    def _micro_loss(self, mb: Batch, denom: dict, temperature: float) -> tuple[torch.Tensor, dict]:
        """One micro-batch (on the model's device) -> (summed loss, metrics), as the update runs it."""
        return micro_loss(self.loss_terms(), self._forward(mb, temperature), mb, denom)

    def update(self, batch: Batch) -> dict[str, float]:
        """One training step's actor update. Returns `actor/...` metrics.

        Data-parallel: every rank gets the whole batch and trains on its slice of each mini-batch
        (see workers/dp.py); counts and shares are the global mini-batch's, and the loss is
        scaled by the world size because FSDP averages gradients over ranks."""
        c, temperature = self.cfg, batch.meta.get("temperature", 1.0)
        if not self.on_policy and "old_log_probs" not in batch:
            raise ValueError("old_log_probs may be left out only for an on-policy update (one epoch, one mini-batch)")
        # on-policy: the plan found a step's batch fits one mini-batch; rows beyond train_batch_size x n
        # (rollout.agent_history=split's extra sequences) join it, so the one step stays at the rollout weights
        mini = max(self.mini_batch_size, len(batch)) if self.on_policy else self.mini_batch_size
        if self.on_policy and not on_policy_update(self.model, c.ppo_epochs, mini, len(batch)):
            raise ValueError("on_policy=True needs an on-policy update (one epoch, one mini-batch, no dropout)")
        tis_metrics = {}
        if not self.on_policy and self.tis_cap is not None and "rollout_log_probs" in batch:
            w, tis_metrics = tis_weights(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"],
                                         self.tis_cap)
            batch = batch | Batch({"tis_weight": w})
        self.model.train()
        minis = rl_mini_batches(batch, mini, c.ppo_epochs, c.shuffle, self.gen, self.micro_batch_size,
                                c.max_tokens_per_micro_batch, model_device(self.model),
                                lambda mini: agg_denominators(_loss_mask(mini).float()),
                                by_group=share_prompt(self.mcfg, self.model))
        try:
            res = run_update(minis, self.loss_terms(), forward=lambda mb: self._forward(mb, temperature),
                             optim=self.optim)
        finally:
            if self.routing is not None:
                self.routing.clear()
        self.sched.step()
        out = {k.removeprefix("actor/") if k.startswith("actor/rollout_corr/") else k: v
               for k, v in res.metrics("actor/").items()}
        out.update({k: float(v) for k, v in tis_metrics.items()})
        out["actor/lr"] = self.sched.get_last_lr()[0]
        return out


def _loss_mask(batch: Batch) -> torch.Tensor:
    """(B, T): the tokens the actor's loss counts (overlong filtering zeroes rows of `loss_mask`)."""
    return batch["loss_mask"] if "loss_mask" in batch else batch["response_mask"]


def on_policy_update(model, ppo_epochs: int, mini_batch_size: int, batch_size: int) -> bool:
    """Whether the actor's update takes its one optimizer step at the rollout weights with the
    forward the old-log-prob pass would run: one epoch, the whole batch (`batch_size` rows at
    most) in one mini-batch, and no dropout (train-mode forward = eval-mode forward). Then the
    update's detached log-probs are the old log-probs and the separate pass can be skipped."""
    dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    dropout = dropout or getattr(getattr(model, "config", None), "attention_dropout", 0.0) > 0
    return ppo_epochs == 1 and batch_size <= mini_batch_size and not dropout


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
                  top_k=mb.meta.get("top_k", 0), top_p=mb.meta.get("top_p", 1.0),
                  **({"vision": mb["vision"]} if "vision" in mb else {}),  # a VLM's image prompts
                  **({"share_prompt": True} if share_prompt(mcfg, model) else {}))


def share_prompt(mcfg: ModelConfig, model) -> bool:
    """Whether model.share_prompt applies to `model`'s forwards: not with packing, and not for an
    MoE policy with router hooks (models/moe.py: replay and the aux loss's capture work on whole
    rows); models/shared_prompt.py checks the rest at run time."""
    return mcfg.share_prompt and not mcfg.use_packing and routing_of(model) is None


def batch_log_probs(model, batch: Batch, mcfg: ModelConfig, micro_batch_size: int, max_tokens: int,
                    with_entropy: bool, routed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (B, T) fp32 on the CPU, and entropies or None, of a whole batch at its rollout
    temperature: micro-batches (token budget honoured) on the model's device, in eval mode,
    put back in batch order. The actor's old log-probs and the reference's log-probs. routed:
    the actor of an MoE policy, whose routers replay the rollout's experts when the run does
    (models/moe.select_for); the reference (a LoRA one is the actor's module) routes itself."""
    temperature = batch.meta.get("temperature", 1.0)

    def run(mb: Batch):
        if routed:
            select_for(model, mb)  # MoE: the rollout's experts when the run replays them
        lp, ent = micro_log_probs(model, mb, mcfg, temperature, with_entropy)
        return lp.float(), ent.float() if with_entropy else None

    logp, ent = map_micro_batches(model, batch, micro_batch_size, max_tokens, run)
    return logp, ent
