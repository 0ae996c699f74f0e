"""Direct Preference Optimization (`reinforge dpo`): https://arxiv.org/abs/2305.18290

Per pair (x, y_c, y_r), with sequence log-probs logp(y|x) (sum or mean of token log-probs):

    z    = (logp_pi(y_c) - logp_pi(y_r)) - (logp_ref(y_c) - logp_ref(y_r))
    loss = -log sigma(beta z)            (sigmoid; or ipo / hinge, reinforge.algos.preference)

Chosen and rejected sequences go through the policy in one forward pass (concatenated along
the batch: rows b and B + b are pair b). The reference-free losses (simpo, cpo, orpo:
algos.preference.REFERENCE_FREE) build no reference at all. Otherwise the reference is either a
frozen model kept in memory, or (dpo.precompute_ref) run once over all pairs at the start, its
log-probs cached in run_dir/ref_logps.pt keyed by the data's and the reference's fingerprint,
and then freed.

KTO (dpo.loss_type=kto) trains on labelled completions, one row each, against the live
reference; its reference point z0 = max(0, mean(logp_pi - logp_ref)) over mismatched pairs
(prompt i with the completion of item i - 1 of the same batch, cyclically, as TRL builds them)
is computed once per batch, before its micro-batches (`batch_state`), so accumulation stays exact.

dpo.reduction (resolved per loss type by the plan) picks what the loss reads; the reference's
log-probs are kept as sums and reduced with the batch's token counts, so the logged rewards/*
and logps/* of the losses with a reference are TRL's: beta (sum pi - sum ref) and sums.

A vision-language model.path reads the pairs with its processor: an image prompt's chosen and
rejected rows share its PromptImages (one encoding), and the policy's and the reference's
log-probs (live or precomputed) go through the same image forward (forward.response_logprobs
with `vision`). The vision tower is frozen unless model.freeze_vision_tower=false;
model.lora_rank > 0 puts LoRA adapters on the policy's language model (the reference is the
model folder loaded on its own, or dpo.ref_model_path).
"""
from __future__ import annotations

import gc
import os
from pathlib import Path

import torch

from reinforge.algos.preference import (REFERENCE_FREE, UNPAIRED, dpo_loss, dpo_reward_metrics, kto_loss,
                                       kto_mismatched_index, kto_reference_point, reduce_sequence,
                                       reference_free_loss, sequence_logps)
from reinforge.config.preference import DPOConfig
from reinforge.models.forward import response_logprobs
from reinforge.models.loading import load_causal_lm
from reinforge.models.lora import with_lora
from reinforge.seeding import seed_everything
from reinforge.trainers.plan import SupervisedPlan
from reinforge.trainers.preference_common import (PairSubset, PairTrainer, load_inputs, pair_tensors,
                                                  unpaired_tensors)
from reinforge.trainers.validation import PromptEvaluator
from reinforge.workers.update_loop import chunks


def response_token_logps(model, batch: dict, model_cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs of each row and the mask of its response tokens: (2B, L) -> (2B, L-1) x2.

    Rows are right-padded whole sequences, so the "response" of response_logprobs is every token
    after the first; loss_mask[:, 1:] keeps the chosen/rejected tokens (and their EOS).
    """
    L = batch["input_ids"].shape[1]
    logp, _ = response_logprobs(model, batch["input_ids"], batch["attention_mask"], L - 1,
                                fused=model_cfg.fused_logprobs, chunk_size=model_cfg.logprob_chunk_size,
                                vision=batch.get("vision"))
    return logp.float(), batch["loss_mask"][:, 1:]


def policy_sequence_logps(model, batch: dict, model_cfg, reduction: str) -> torch.Tensor:
    """Sequence log-probs (sum or mean over response tokens) of each row: (2B, L) batch -> (2B,)."""
    return sequence_logps(*response_token_logps(model, batch, model_cfg), reduction)


def _model_fingerprint(path: str) -> str:
    """Path plus weight files' sizes and mtimes: a re-exported reference invalidates the cache."""
    p = Path(path).resolve()
    files = sorted(f for f in p.iterdir() if f.suffix in (".safetensors", ".bin"))
    return f"{p}|" + "|".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


@torch.no_grad()
def reference_table(ref_model, pairs: PairSubset, pad_id: int, device, micro: int, model_cfg) -> torch.Tensor:
    """Reference summed log-probs of every pair, in subset order: (N, 2) [chosen, rejected]."""
    rows = []
    for items in chunks([pairs[i] for i in range(len(pairs))], micro):
        seq = policy_sequence_logps(ref_model, pair_tensors(items, pad_id, device), model_cfg, "sum")
        B = len(items)
        rows.append(torch.stack([seq[:B], seq[B:]], dim=1).cpu())
    return torch.cat(rows)


def cached_reference_logps(plan: SupervisedPlan, splits: dict[str, PairSubset], pad_id: int) -> dict[str, torch.Tensor]:
    """{split: (N, 2)} from run_dir/ref_logps.pt, computing (and saving) what is missing.

    The reference model is loaded only when some split is not cached, and freed right after.
    """
    cfg: DPOConfig = plan.cfg
    m = cfg.model
    ref_path = cfg.dpo.ref_model_path or m.path
    cache_file = Path(cfg.trainer.run_dir) / "ref_logps.pt"
    cache = torch.load(cache_file, weights_only=True) if cache_file.exists() else {}
    ref_id = _model_fingerprint(ref_path)
    keys = {s: f"{s}:{p.fingerprint()}:sum:{ref_id}" for s, p in splits.items()}  # sums: reduced per batch
    missing = [s for s in splits if keys[s] not in cache]
    if missing:
        ref = load_causal_lm(ref_path, dtype=m.dtype, device=plan.device, trust_remote_code=m.trust_remote_code,
                             attn_implementation=m.attn_implementation, train=False)
        for s in missing:
            cache[keys[s]] = reference_table(ref, splits[s], pad_id, plan.device, plan.micro_batch_size, m)
        del ref
        gc.collect()
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        torch.save(cache, tmp)
        os.replace(tmp, cache_file)  # a crash mid-write never leaves a truncated cache
    return {s: cache[keys[s]] for s in splits}


class DPOTrainer(PairTrainer):
    name = "dpo"

    def __init__(self, cfg: DPOConfig, train_dataset=None, eval_dataset=None):
        seed_everything(cfg.trainer.seed)
        # datasets: trainers/inputs.py; a VLM's pairs read with its processor
        plan, tok, train, val, skipped, self.processor = load_inputs(cfg, train_dataset, eval_dataset)
        cfg, m = plan.cfg, plan.cfg.model  # the resolved copy
        kw = dict(dtype=m.dtype, device=plan.device, trust_remote_code=m.trust_remote_code,
                  attn_implementation=m.attn_implementation)
        self.model = load_causal_lm(m.path, gradient_checkpointing=m.gradient_checkpointing,
                                    freeze_vision_tower=m.freeze_vision_tower, **kw)
        self.model = with_lora(self.model, m)  # models/lora.py: unchanged when model.lora_rank is 0
        self.setup(plan, tok, train, val, skipped)
        self.reference, self.ref_cache = None, None
        uses_ref = cfg.dpo.loss_type not in REFERENCE_FREE  # simpo/cpo/orpo read the policy alone
        if uses_ref and cfg.dpo.precompute_ref:
            splits = {"train": train, **({"val": val} if val else {})}
            self.ref_cache = cached_reference_logps(plan, splits, self.pad_id)
        elif uses_ref:
            self.reference = load_causal_lm(cfg.dpo.ref_model_path or m.path, train=False, **kw)
        if cfg.eval.prompt_files:  # greedy / sampled accuracy of the policy on RL prompts
            self.prompt_eval = PromptEvaluator(self.model, tok, cfg.eval, device=plan.device, processor=self.processor)

    def reference_sums(self, items: list[dict], batch: dict, split: str) -> torch.Tensor:
        """(2B,) reference summed log-probs of the chosen, then the rejected responses."""
        if self.ref_cache is not None:
            table = self.ref_cache[split][torch.tensor([it["idx"] for it in items])].to(self.device)  # (B, 2)
            return torch.cat([table[:, 0], table[:, 1]])
        with torch.no_grad():
            return policy_sequence_logps(self.reference, batch, self.cfg.model, "sum")  # (2B,)

    def batch_state(self, items: list[dict]) -> dict:
        return {"kl": self.kl_reference_point(items)} if self.cfg.dpo.loss_type in UNPAIRED else {}

    @torch.no_grad()
    def kl_reference_point(self, items: list[dict]) -> torch.Tensor:
        """KTO's z0 over a whole batch of labelled completions: () from N mismatched pairs."""
        m, red = self.cfg.model, self.cfg.dpo.reduction
        mismatched = [{"prompt_ids": it["prompt_ids"], "completion_ids": items[j]["completion_ids"],
                       "vision": it.get("vision")} for it, j in zip(items, kto_mismatched_index(len(items)))]
        pol, ref = [], []
        for part in chunks(mismatched, self.micro):
            batch = unpaired_tensors(part, self.pad_id, self.device)
            pol.append(policy_sequence_logps(self.model, batch, m, red))
            ref.append(policy_sequence_logps(self.reference, batch, m, red))
        return kto_reference_point(torch.cat(pol), torch.cat(ref))

    def unpaired_loss(self, items: list[dict], kl: torch.Tensor):
        """KTO's mean loss over labelled completions `items` (B,) and its metrics."""
        p = self.cfg.dpo
        batch = unpaired_tensors(items, self.pad_id, self.device)  # (B, L)
        seq = policy_sequence_logps(self.model, batch, self.cfg.model, p.reduction)  # (B,)
        with torch.no_grad():
            ref = policy_sequence_logps(self.reference, batch, self.cfg.model, p.reduction)
        labels = torch.tensor([it["label"] for it in items], device=seq.device)
        loss, metrics = kto_loss(seq, ref, labels, kl, beta=p.beta, desirable_weight=p.desirable_weight,
                                 undesirable_weight=p.undesirable_weight)
        metrics["desirable_fraction"] = labels.float().mean()
        return loss, metrics

    def pair_loss(self, items: list[dict], split: str = "train", kl: torch.Tensor | None = None):
        if self.cfg.dpo.loss_type in UNPAIRED:
            return self.unpaired_loss(items, kl)
        p, B = self.cfg.dpo, len(items)
        batch = pair_tensors(items, self.pad_id, self.device)  # (2B, L): chosen rows, then rejected
        logp, mask = response_token_logps(self.model, batch, self.cfg.model)  # (2B, L-1)
        sums = sequence_logps(logp, mask, "sum")  # (2B,)
        counts = mask.sum(-1).to(sums.dtype)
        seq = reduce_sequence(sums, counts, p.reduction)  # what the loss reads
        if p.loss_type in REFERENCE_FREE:  # TRL's CPO/ORPO trainers log the reduced log-probs
            loss, metrics = reference_free_loss(seq[:B], seq[B:], p.loss_type, p.beta, p.simpo_gamma)
            logged = seq
        else:
            ref_sums = self.reference_sums(items, batch, split)
            ref = reduce_sequence(ref_sums, counts, p.reduction)
            loss, metrics = dpo_loss(seq[:B], seq[B:], ref[:B], ref[B:], beta=p.beta, loss_type=p.loss_type,
                                     label_smoothing=p.label_smoothing)
            # TRL's DPOTrainer logs beta (sum pi - sum ref) and sums whatever the loss reads
            metrics.update(dpo_reward_metrics(sums[:B], sums[B:], ref_sums[:B], ref_sums[B:], p.beta))
            logged = sums
        if p.nll_coef:
            # RPO, and CPO's / ORPO's NLL term: a pair loss alone may lower both likelihoods (only
            # their gap is constrained); the chosen response's per-token NLL keeps it likely.
            nll = -sequence_logps(logp[:B], mask[:B], "mean").mean()
            loss = loss + p.nll_coef * nll
            metrics["nll/chosen"] = nll.detach()
        metrics["logps/chosen"] = logged[:B].detach().mean()
        metrics["logps/rejected"] = logged[B:].detach().mean()
        return loss, metrics
