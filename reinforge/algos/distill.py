"""On-policy distillation: the student samples, a frozen teacher scores the student's tokens.

Two objectives (docs/algorithms.md, "On-policy distillation"):

reverse_kl (Thinking Machines' on-policy distillation; GKD with beta = 1 on sampled tokens):
the per-token estimate of KL(student || teacher) on the student's own sample y,
    k_t = log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t),
is a per-token reward -k_t. With no discounting (the default) the advantage of token t is
-k_t alone; with return_to_go it is the sum of -k_s over s >= t. The policy gradient with
these advantages is the gradient of the sequence-level reverse KL (the score-function
estimator), and it runs through the ordinary PPO loss (on-policy: ratio 1).

gkd (Agarwal et al. 2024, "On-Policy Distillation of Language Models", GKD): the generalised
Jensen-Shannon divergence between the teacher's (p) and the student's (q) next-token
distributions, over the whole vocabulary, at every position of the student's sample:
    M = beta * p + (1 - beta) * q
    JSD_beta = beta * KL(p || M) + (1 - beta) * KL(q || M)
a direct loss, differentiated through q. JSD_beta / beta -> KL(p || q) (forward KL) as
beta -> 0 and JSD_beta / (1 - beta) -> KL(q || p) (reverse KL) as beta -> 1; at exactly 0 and 1
(where JSD_beta itself is 0) the two KLs are used, as TRL's GKDTrainer does.

Shapes: B sequences, T response tokens, N flattened tokens, V vocabulary, H hidden.
"""
from __future__ import annotations

import torch

from .fused_logprobs import FUSED_CHUNK_ELEMENTS
from .logit_cap import cap_logits
from .logprobs import _acc_dtype

DISTILL_MODES = ("reverse_kl", "gkd")


def reverse_kl_tokens(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """k_t = log pi_student(y_t) - log pi_teacher(y_t) on valid tokens, 0 elsewhere.

    All (B, T); an unbiased single-sample estimate of KL(student || teacher) at position t when
    y_t was drawn from the student."""
    return (student_log_probs - teacher_log_probs) * mask


def distill_advantages(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor,
                       return_to_go: bool = False) -> torch.Tensor:
    """(B, T) advantages of the reverse-KL objective: -k_t, or sum_{s >= t} -k_s (return-to-go,
    undiscounted); 0 outside `mask`."""
    r = -reverse_kl_tokens(student_log_probs, teacher_log_probs, mask)
    if return_to_go:
        r = r.flip(-1).cumsum(-1).flip(-1) * mask
    return r


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float) -> torch.Tensor:
    """(N, V) student and teacher logits (already divided by the temperature) -> (N,) JSD_beta
    per row, in fp32 at least. beta = 0: KL(teacher || student); beta = 1: KL(student || teacher)."""
    acc = _acc_dtype(student_logits.dtype)
    log_q = torch.log_softmax(student_logits.to(acc), -1)
    log_p = torch.log_softmax(teacher_logits.to(acc), -1)
    if beta == 0.0:
        return _kl(log_p, log_q)
    if beta == 1.0:
        return _kl(log_q, log_p)
    log_m = torch.logsumexp(torch.stack([log_p + torch.log(torch.tensor(beta, dtype=acc)),
                                         log_q + torch.log(torch.tensor(1.0 - beta, dtype=acc))]), dim=0)
    return beta * _kl(log_p, log_m) + (1.0 - beta) * _kl(log_q, log_m)


def _kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) per row from log-probabilities (N, V) -> (N,) (finite: no filtered -inf entries)."""
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def _chunk_terms(hs, ws, ht, wt, labels, beta, temperature, s_cap=(1.0, 0.0), t_cap=(1.0, 0.0)):
    """One chunk: (jsd, log-prob of labels, student entropy), each (n,), from hidden states.
    s_cap / t_cap: each model's own (scale, softcap) of its head's output (algos/logit_cap.py)."""
    acc = _acc_dtype(hs.dtype)
    zs = cap_logits(hs.to(acc) @ ws.to(acc).T, *s_cap) / temperature  # (n, V)
    zt = cap_logits(ht.to(acc) @ wt.to(acc).T, *t_cap) / temperature
    log_q = torch.log_softmax(zs, -1)
    logp = log_q.gather(-1, labels[:, None]).squeeze(-1)
    ent = -(log_q.exp() * log_q).sum(-1)
    return generalized_jsd(zs, zt, beta), logp, ent


class _ChunkedDistill(torch.autograd.Function):
    """Forward keeps (N,) statistics per chunk; backward recomputes each chunk's logits and
    differentiates the same formula, so no (N, V) tensor lives past its chunk."""

    @staticmethod
    def forward(ctx, hs, ws, ht, wt, labels, beta, temperature, chunk, s_cap=(1.0, 0.0), t_cap=(1.0, 0.0)):
        outs = [[], [], []]
        with torch.no_grad():
            for s in range(0, hs.shape[0], chunk):
                sl = slice(s, s + chunk)
                for o, x in zip(outs, _chunk_terms(hs[sl], ws, ht[sl], wt, labels[sl], beta, temperature, s_cap,
                                                   t_cap)):
                    o.append(x)
        ctx.save_for_backward(hs, ws, ht, wt, labels)
        ctx.beta, ctx.temperature, ctx.chunk, ctx.caps = beta, temperature, chunk, (s_cap, t_cap)
        return tuple(torch.cat(o) for o in outs)

    @staticmethod
    def backward(ctx, g_jsd, g_logp, g_ent):
        hs, ws, ht, wt, labels = ctx.saved_tensors
        grad_h = torch.empty_like(hs)
        grad_w = torch.zeros_like(ws, dtype=_acc_dtype(ws.dtype))
        for s in range(0, hs.shape[0], ctx.chunk):
            sl = slice(s, s + ctx.chunk)
            with torch.enable_grad():
                h, w = hs[sl].detach().requires_grad_(), ws.detach().requires_grad_()
                jsd, logp, ent = _chunk_terms(h, w, ht[sl], wt, labels[sl], ctx.beta, ctx.temperature, *ctx.caps)
                total = (jsd * g_jsd[sl]).sum() + (logp * g_logp[sl]).sum() + (ent * g_ent[sl]).sum()
                gh, gw = torch.autograd.grad(total, (h, w))
            grad_h[sl] = gh
            grad_w += gw
        return grad_h, grad_w.to(ws.dtype), None, None, None, None, None, None, None, None


def chunked_distill_from_hidden(student_hidden: torch.Tensor, student_head: torch.Tensor,
                                teacher_hidden: torch.Tensor, teacher_head: torch.Tensor, labels: torch.Tensor,
                                beta: float, temperature: float = 1.0, chunk_size: int | None = None,
                                student_cap: tuple[float, float] = (1.0, 0.0),
                                teacher_cap: tuple[float, float] = (1.0, 0.0)):
    """GKD's per-token JSD_beta, and the student's log-probs of `labels` and entropies, from the
    last hidden states and LM heads, chunked over tokens like `fused_logprobs_from_hidden`.

    student_hidden (N, H), student_head (V, H), teacher_hidden (N, H'), teacher_head (V, H'),
    labels (N,). -> (jsd, logp, entropy), each (N,) fp32 (at least); gradients flow to the
    student's hidden states and head only. chunk_size None / <= 0: FUSED_CHUNK_ELEMENTS logits.
    student_cap / teacher_cap: each model's (scale, softcap) of its head's output, applied before
    the temperature as the models' own forwards do (models/checks.logit_transform; (1, 0): none).
    """
    if student_head.shape[0] != teacher_head.shape[0]:
        raise ValueError(f"student and teacher vocabularies differ: {student_head.shape[0]} vs {teacher_head.shape[0]}")
    if not chunk_size or chunk_size <= 0:
        chunk_size = max(1, FUSED_CHUNK_ELEMENTS // student_head.shape[0])
    return _ChunkedDistill.apply(student_hidden, student_head, teacher_hidden.detach(), teacher_head.detach(), labels,
                                 float(beta), float(temperature), int(chunk_size),
                                 tuple(map(float, student_cap)), tuple(map(float, teacher_cap)))
