"""GKD's distillation term inside the actor's update (teacher.mode=gkd).

The generalised JSD needs the teacher's whole next-token distribution at every response
position, so it cannot be precomputed into the batch as (B, T) numbers the way the reference's
or the reverse-KL teacher's log-probs are: a (B, T, V) tensor would be the largest of the step.
Instead each micro-batch runs the frozen teacher's backbone (no grad) beside the student's and
algos.distill.chunked_distill_from_hidden turns both hidden states into the JSD, the student's
log-probs and entropies chunk by chunk, from one student forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from reinforge.algos.distill import chunked_distill_from_hidden
from reinforge.models.checks import logit_transform
from reinforge.models.forward import _lm_parts, position_ids_from_mask, unwrap_peft


@dataclass
class GKDTerm:
    teacher: Any  # the frozen teacher causal LM (eval mode, no grad), on the actor's device
    beta: float  # teacher.beta
    coef: float  # teacher.coef: the loss is pg_loss + coef * aggregated JSD


def _head_weight(head) -> torch.Tensor:
    if getattr(head, "bias", None) is not None:
        raise ValueError("teacher.mode=gkd needs LM heads without a bias (hidden @ weight.T)")
    return head.weight


def gkd_log_probs(student, term: GKDTerm, mb, temperature: float, chunk_size: int = 0, autocast: bool = False):
    """One micro-batch on the models' device -> (log_probs, entropy, jsd), each (b, T): the
    student's log-probs and entropies of its sampled response tokens (with grad, as
    actor.micro_log_probs) and JSD_beta(teacher, student) at each response position, all at the
    rollout's temperature."""
    ids, am = mb["input_ids"], mb["attention_mask"]
    B, T = mb["responses"].shape
    fwd = dict(input_ids=ids, attention_mask=am, position_ids=position_ids_from_mask(am), use_cache=False)

    def rows(x):  # (B, L, H) -> the (B * T, H) states that predict the response tokens
        return x[:, -T - 1:-1].reshape(B * T, x.shape[-1])

    s_backbone, s_head = _lm_parts(student)
    t_backbone, t_head = _lm_parts(term.teacher)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        with torch.no_grad():
            ht = rows(t_backbone(**fwd).last_hidden_state)
        hs = rows(s_backbone(**fwd).last_hidden_state)
    w = _head_weight(s_head)
    with torch.autocast(ids.device.type, enabled=False):  # the heads and softmax stay in their dtype (fp32)
        jsd, logp, ent = chunked_distill_from_hidden(hs.to(w.dtype), w, ht, _head_weight(t_head), ids[:, -T:].reshape(-1),
                                                     term.beta, temperature, chunk_size,
                                                     student_cap=logit_transform(unwrap_peft(student).config),
                                                     teacher_cap=logit_transform(unwrap_peft(term.teacher).config))
    return logp.view(B, T), ent.view(B, T), jsd.view(B, T)
