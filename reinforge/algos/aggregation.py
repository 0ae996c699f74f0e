"""Loss aggregation: a per-token loss matrix (B, T) -> a scalar.

Modes (``AGG_MODES``, an ``algos.registry.Registry`` of one function per mode, no params):

- ``token-mean``: sum of all valid token losses / number of valid tokens (DAPO token-level loss).
- ``seq-mean-token-sum``: per-sequence sum of token losses, averaged over sequences.
- ``seq-mean-token-mean``: per-sequence mean of token losses, averaged over sequences
  (the original GRPO objective: every sequence weighs the same whatever its length).
- ``seq-mean-token-sum-norm``: per-sequence sum / ``norm_const`` (default T, the padded response
  length), averaged over sequences (Dr.GRPO, https://arxiv.org/abs/2503.20783: a constant
  normaliser removes the length bias of per-sequence means).
- ``token-sum``: sum of all valid token losses, divided by nothing (veRL's mode of that name,
  verl-project/verl PR #7197: every token weighs the same whatever the batch size, so the loss
  and the gradient scale with the number of tokens; lower the learning rate to match).

Gradient accumulation. Every mode is a plain sum over rows divided by a global count, so
passing the *whole mini-batch's* ``num_tokens`` / ``num_seqs`` (see ``agg_denominators``) to each
micro-batch makes the sum of micro-batch losses equal the mini-batch loss exactly (do not also
divide by the number of micro-batches). When a count is None it is taken from this batch.
``num_seqs`` counts sequences with at least one valid token, so fully-masked rows (filtered
samples) do not dilute the average. For ``seq-mean-token-sum-norm`` pass ``norm_const``
explicitly (e.g. the configured max response length) when micro-batches are padded to
different lengths.
"""

from __future__ import annotations

import torch

from .masked import _safe_div, masked_mean, masked_sum
from .registry import Registry


def agg_denominators(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Global counts of a mini-batch. mask: (B, T) -> {"num_tokens": (), "num_seqs": ()} tensors.

    Compute them once on the whole mini-batch (summed across data-parallel ranks by the trainer
    when the loss is averaged globally) and pass them to every micro-batch's ``agg_loss``.
    """
    m = mask.float()
    return {"num_tokens": m.sum(), "num_seqs": (m.sum(-1) > 0).float().sum()}


def _as_tensor(v, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(v, dtype=like.dtype, device=like.device)


def _token_sum(loss_mat, mask, num_tokens, num_seqs, norm_const):
    return masked_sum(loss_mat, mask)  # a plain sum: micro-batch sums add up to the mini-batch's exactly


def _token_mean(loss_mat, mask, num_tokens, num_seqs, norm_const):
    den = mask.float().sum() if num_tokens is None else num_tokens
    return _safe_div(masked_sum(loss_mat, mask), _as_tensor(den, loss_mat))


def _seq_mean(seq: torch.Tensor, mask, num_seqs, like: torch.Tensor) -> torch.Tensor:
    """Mean over sequences of seq (B,), by the global count of non-empty sequences."""
    den = agg_denominators(mask)["num_seqs"] if num_seqs is None else num_seqs
    return _safe_div(seq.sum(), _as_tensor(den, like))


def _seq_mean_token_sum(loss_mat, mask, num_tokens, num_seqs, norm_const):
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1), mask, num_seqs, loss_mat)


def _seq_mean_token_mean(loss_mat, mask, num_tokens, num_seqs, norm_const):
    return _seq_mean(masked_mean(loss_mat, mask, dim=-1), mask, num_seqs, loss_mat)  # 0 for empty rows


def _seq_mean_token_sum_norm(loss_mat, mask, num_tokens, num_seqs, norm_const):
    const = loss_mat.shape[-1] if norm_const is None else norm_const
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1) / const, mask, num_seqs, loss_mat)


AGG_MODES = Registry("loss aggregation mode")
AGG_MODES.register("token-mean", _token_mean, doc="sum of valid token losses / valid tokens (DAPO token-level loss)")
AGG_MODES.register("seq-mean-token-sum", _seq_mean_token_sum, doc="per-sequence sum, averaged over sequences")
AGG_MODES.register("seq-mean-token-mean", _seq_mean_token_mean,
                   doc="per-sequence mean, averaged over sequences (original GRPO)")
AGG_MODES.register("seq-mean-token-sum-norm", _seq_mean_token_sum_norm,
                   doc="per-sequence sum / norm_const (actor.loss_norm_const, default the max response length), "
                       "averaged over sequences (Dr.GRPO)")
AGG_MODES.register("token-sum", _token_sum, doc="sum of valid token losses, divided by nothing (veRL PR #7197)")


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_const: float | None = None,
) -> torch.Tensor:
    """Aggregate loss_mat (B, T) over mask (B, T) into a scalar according to ``mode``.

    num_tokens / num_seqs: global counts (scalars) of the mini-batch, None -> this batch's.
    norm_const: Dr.GRPO constant for ``seq-mean-token-sum-norm`` (None -> T). A zero count
    gives a loss of 0 (never NaN).
    """
    return AGG_MODES.entry(mode).fn(loss_mat, mask, num_tokens, num_seqs, norm_const)
