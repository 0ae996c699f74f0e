"""Named stages of the RL step that presets switch on: KL in the reward, advantages, dynamic
sampling (DAPO), overlong filtering (DAPO), distillation's advantages. Each takes a Batch and
returns a Batch plus metrics; the trainer calls them by configuration, never by algorithm name."""
from __future__ import annotations

import torch

from reinforge.algos import distill
from reinforge.algos.advantages import AdvantageInput, compute_advantages, estimator_kwargs
from reinforge.algos.kl import kl_penalty
from reinforge.algos.masked import masked_mean
from reinforge.config.schema import AlgorithmConfig, TeacherConfig
from reinforge.protocol import Batch


def apply_kl_in_reward(batch: Batch, ctrl, estimator: str) -> tuple[Batch, dict[str, float]]:
    """token_level_rewards = token_level_scores - beta * KL(actor || ref) per token; updates `ctrl`."""
    mask = batch["response_mask"].float()
    kld = kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], estimator) * mask  # (B, T)
    beta = ctrl.value
    current_kl = float(masked_mean(kld, mask, dim=-1).mean())  # mean over sequences of per-seq mean
    ctrl.update(current_kl, len(batch))
    out = Batch({"token_level_rewards": batch["token_level_scores"] - beta * kld})
    return out, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def advantages_stage(batch: Batch, algo: AlgorithmConfig, value_pretraining: bool = False) -> Batch:
    """Advantages and returns by the configured estimator (on the controller process); an
    estimator that takes its hyper-parameters as keywords gets them from ``algo``.

    During VAPO value pretraining the critic's targets are Monte-Carlo returns (lambda = 1)."""
    rewards = batch["token_level_rewards"] if "token_level_rewards" in batch else batch["token_level_scores"]
    inp = AdvantageInput(
        token_level_rewards=rewards, response_mask=batch["response_mask"].float(),
        values=batch["values"] if "values" in batch else None,
        group_ids=batch["group_ids"], gamma=algo.gamma, lam=algo.lam,
        lam_critic=1.0 if value_pretraining else algo.lam_critic,
        length_adaptive_alpha=algo.length_adaptive_alpha, norm_by_std=algo.norm_adv_by_std,
        baseline_rewards=batch["baseline_scores"] if "baseline_scores" in batch else None,
        old_log_probs=batch["old_log_probs"] if "old_log_probs" in batch else None,
        sum_pi_squared=batch["sum_pi_squared"] if "sum_pi_squared" in batch else None)
    adv, ret = compute_advantages(algo.adv_estimator, inp, **estimator_kwargs(algo.adv_estimator, algo))
    out = {"advantages": adv, "returns": ret}
    if "token_level_rewards" not in batch:
        out["token_level_rewards"] = rewards
    return Batch(out)


def greedy_baseline(batch: Batch, rollout, reward) -> tuple[Batch, dict[str, float]]:
    """ReMax: one greedy response per prompt; its score is the baseline of the prompt's samples.

    -> baseline_scores (B,), aligned with the rows of `batch` through their group ids."""
    uniq, inv = torch.unique(batch["group_ids"], return_inverse=True)
    first = torch.full((len(uniq),), len(batch), dtype=torch.long).scatter_reduce(
        0, inv, torch.arange(len(batch)), "amin")  # first row of each group
    keys = ["prompt_ids", "prompt_text", "ground_truth", "data_source", "extra"]
    prompts = batch.index(first.tolist()).select(keys + (["vision"] if "vision" in batch else []))  # a VLM's images
    prompts["uid"] = uniq
    greedy = rollout.generate(prompts, n=1, greedy=True)
    base = reward.score(greedy).scores  # (G,) in the order of `uniq`
    return Batch({"baseline_scores": base[inv]}), {"remax/baseline_score_mean": float(base.mean())}


def zero_variance_groups(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) scores, (B,) ids -> (B,) bool: row belongs to a group whose scores are all equal."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1 if len(inv) else 0
    gmax = torch.full((n,), -float("inf")).scatter_reduce(0, inv, scores.float(), "amax")
    gmin = torch.full((n,), float("inf")).scatter_reduce(0, inv, scores.float(), "amin")
    return (gmax == gmin)[inv]


def keep_informative_groups(batch: Batch) -> tuple[Batch, int, int]:
    """DAPO dynamic sampling filter: drop groups whose scores are all equal (zero advantage).

    Returns the kept rows, the number of groups seen and the number kept."""
    flat = zero_variance_groups(batch["seq_scores"], batch["group_ids"])
    keep = (~flat).nonzero().flatten().tolist()
    n_groups = len(torch.unique(batch["group_ids"]))
    n_kept = len(torch.unique(batch["group_ids"][~flat])) if keep else 0
    return batch.index(keep), n_groups, n_kept


def overlong_filter(batch: Batch) -> tuple[Batch, dict[str, float]]:
    """DAPO overlong filtering: truncated responses (no EOS) get loss_mask 0 everywhere."""
    keep = (~batch["truncated"]).float()[:, None]
    loss_mask = batch["response_mask"].float() * keep
    return Batch({"loss_mask": loss_mask}), {"overlong/filtered_frac": float(1 - keep.mean())}


def distill_advantages(batch: Batch, task_advantages: torch.Tensor, t: TeacherConfig) -> tuple[torch.Tensor, dict]:
    """On-policy distillation (algos/distill.py): task_reward_weight * `task_advantages` (B, T)
    (the estimator's) + coef * (minus the per-token reverse KL to the teacher, or its
    return-to-go) for teacher.mode=reverse_kl; gkd's term is a loss in the actor's update, so
    there only the task reward's share remains. -> advantages (B, T); metrics distill/reverse_kl
    (the mean per response token of log pi_student - log pi_teacher of the sampled tokens, at the
    rollout weights), distill/teacher_log_prob and distill/student_log_prob (mean log-probs)."""
    mask = batch["response_mask"].float()
    student, teacher = batch["old_log_probs"], batch["teacher_log_probs"]
    adv = t.task_reward_weight * task_advantages
    if t.mode == "reverse_kl":
        adv = adv + t.coef * distill.distill_advantages(student, teacher, mask, t.return_to_go)
    metrics = {"distill/reverse_kl": float(masked_mean(distill.reverse_kl_tokens(student, teacher, mask), mask)),
               "distill/teacher_log_prob": float(masked_mean(teacher, mask)),
               "distill/student_log_prob": float(masked_mean(student, mask))}
    return adv, metrics
