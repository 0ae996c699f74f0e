"""Per-step statistics of the batch (veRL's metric names where they exist) and the diagnostics
that explain why algorithms differ: entropy, advantage by token position, length of correct vs
incorrect responses, zero-variance groups, KL to the reference. Read out as floats once here."""
from __future__ import annotations

import math

import torch

from reinforge.algos.masked import masked_mean
from reinforge.protocol import Batch
from reinforge.trainers.stages import zero_variance_groups

N_POSITION_BUCKETS = 4


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {}
    x = x.float()
    return {f"{prefix}/mean": float(x.mean()), f"{prefix}/max": float(x.max()), f"{prefix}/min": float(x.min())}


def advantage_by_position(adv: torch.Tensor, mask: torch.Tensor, buckets: int = N_POSITION_BUCKETS) -> dict[str, float]:
    """Mean advantage in `buckets` equal slices of each response (relative position), and the
    Pearson correlation of advantage with absolute token position over valid tokens: the plot
    VAPO uses to show value-initialisation bias (early tokens favoured)."""
    B, T = adv.shape
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)
    pos = torch.arange(T, dtype=torch.float32).expand(B, T)
    rel = (pos / lengths).clamp(max=0.999)
    bucket = (rel * buckets).long()
    out = {}
    for k in range(buckets):
        m = mask * (bucket == k)
        if m.sum() > 0:
            out[f"diag/adv_pos_bucket_{k}"] = float((adv * m).sum() / m.sum())
    valid = mask.bool()
    a, p = adv[valid].float(), pos[valid]
    if a.numel() > 2 and a.std() > 0 and p.std() > 0:
        out["diag/adv_pos_corr"] = float(torch.corrcoef(torch.stack([a, p]))[0, 1])
    return out


def batch_metrics(batch: Batch) -> dict[str, float]:
    mask = batch["response_mask"].float()
    lengths = mask.sum(-1)
    seq_mask = lengths > 0
    m: dict[str, float] = {}
    m.update(_stats("critic/score", batch["seq_scores"]))
    m.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    valid = mask.bool()
    m.update(_stats("critic/advantages", batch["advantages"][valid]))
    m.update(_stats("critic/returns", batch["returns"][valid]))
    if "values" in batch:
        m.update(_stats("critic/values", batch["values"][valid]))
    m.update(_stats("response_length", lengths))
    m["response_length/clip_ratio"] = float(batch["truncated"].float().mean())
    m.update(_stats("prompt_length", batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1)))
    acc = batch["acc"].bool()
    m["reward/acc"] = float(acc.float().mean())
    if acc.any():
        m["response_length/correct_mean"] = float(lengths[acc].mean())
    if (~acc).any():
        m["response_length/incorrect_mean"] = float(lengths[~acc].mean())
    m["diag/zero_var_group_frac"] = _zero_var_group_frac(batch)
    if "entropy" in batch:
        m["actor/entropy"] = float(masked_mean(batch["entropy"], mask))
    if "ref_log_probs" in batch and "old_log_probs" in batch:  # else the on-policy update reports it
        m["actor/ref_kl"] = float(masked_mean(batch["old_log_probs"] - batch["ref_log_probs"], mask))
    m.update(advantage_by_position(batch["advantages"], mask))
    m["batch/sequences"] = float(seq_mask.sum())
    if "trajectory" in batch:  # multi-turn episodes (reinforge.agents.loop)
        from reinforge.agents.loop import episode_metrics

        m.update(episode_metrics(batch["trajectory"]))
    return m


def sample_rows(batch: Batch, max_groups: int = 8, per_group: int = 4) -> list[dict]:
    """A few training rollouts to read (samples/train_step_N.jsonl): the first `per_group`
    samples of each of the first `max_groups` groups, in batch order (no random draw, so the
    training stream is untouched). Per row: group id, prompt, response, ground truth, each reward
    function's score (`rewards`, when the reward worker reports them; None where a function did
    not apply), `score` (their weighted sum plus any reward model / overlong terms), `reward`
    (the token-level rewards summed: score minus the KL penalty when KL is in the reward), acc,
    `advantage` (the mean over the response's tokens) and response length (generated tokens);
    multi-turn episodes add turns, tool calls and errors, turn rewards and the limits hit.
    Image prompts: the first row of each group adds `images`, the prompt's pictures as small
    PNG data URIs (data/images.thumbnail_uri; the report shows them), once per group so the
    file does not grow with n."""
    mask = batch["response_mask"].float()
    lengths = mask.sum(-1)
    adv = (batch["advantages"] * mask).sum(-1) / lengths.clamp(min=1)
    reward = batch["token_level_rewards"].sum(-1)
    fn_scores = batch["reward_fn_scores"] if "reward_fn_scores" in batch else None
    rows, taken = [], {}
    for i, g in enumerate(batch["group_ids"].tolist()):
        if g not in taken and len(taken) == max_groups or taken.get(g, 0) == per_group:
            continue
        taken[g] = taken.get(g, 0) + 1
        row = {"group": g, "prompt": batch["prompt_text"][i], "response": batch["response_text"][i],
               "ground_truth": str(batch["ground_truth"][i])}
        if taken[g] == 1 and "vision" in batch and getattr(batch["vision"][i], "images", ()):
            from reinforge.data.images import thumbnail_uri

            row["images"] = [thumbnail_uri(im) for im in batch["vision"][i].images]
        if fn_scores is not None:
            row["rewards"] = fn_scores[i]
        row.update(score=float(batch["seq_scores"][i]), reward=float(reward[i]), acc=float(batch["acc"][i]),
                   advantage=float(adv[i]), response_length=int(lengths[i]))
        if "trajectory" in batch:
            row.update(episode_row(batch["trajectory"][i]))
        rows.append(row)
    return rows


def episode_row(trajectory: dict) -> dict:
    """What a samples row shows of a multi-turn episode (its `response` holds the whole text)."""
    keys = ("turns", "tool_calls", "tool_errors", "turn_rewards", "truncated", "budget_exhausted")
    return {k: trajectory[k] for k in keys}


def _zero_var_group_frac(batch: Batch) -> float:
    flat = zero_variance_groups(batch["seq_scores"], batch["group_ids"])
    gids = batch["group_ids"]
    uniq = torch.unique(gids)
    flat_groups = torch.unique(gids[flat])
    return len(flat_groups) / max(len(uniq), 1)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
