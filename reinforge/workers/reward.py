"""The reward worker: decode responses, score them, and place each score on the last valid token.

Rule-based functions go through `reinforge.rewards.RewardManager` (worker pool, timeouts, error
counting; the `judge` entry is reinforge.rewards.judge.JudgeScorer); a reward model adds its score;
then the shaping terms (format, DAPO's soft overlong punishment, length penalty) and the clip of
reinforge.rewards.shaping, in the order of its shape_scores.
"""
from __future__ import annotations

import math

import torch

from reinforge.config.schema import AlgorithmConfig, RewardConfig
from reinforge.protocol import Batch
from reinforge.rewards.shaping import apply_shaping


def decode_responses(tokenizer, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """(B, T) ids -> text of the valid tokens, special tokens (EOS) dropped."""
    return [tokenizer.decode(r[m.bool()].tolist(), skip_special_tokens=True) for r, m in zip(responses, response_mask)]


def scores_to_tokens(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence scores -> (B, T) with each score on the sequence's last valid token."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.long().cumsum(-1).argmax(-1))  # index of the last 1 (0 for an empty row)
    out[torch.arange(len(scores)), last] = scores.float()
    return out * response_mask


class RewardWorker:
    def __init__(self, tokenizer, cfg: RewardConfig, algo: AlgorithmConfig, *, max_response_length: int,
                 device: str = "cpu"):
        from reinforge.rewards import RewardManager

        self.tok, self.cfg, self.algo, self.T = tokenizer, cfg, algo, max_response_length
        specs = [(self._judge(cfg, device) if f["name"] == "judge" else f["name"], float(f.get("weight", 1.0)),
                  f.get("style")) for f in cfg.functions]
        self.manager = RewardManager(specs, num_workers=cfg.num_workers, timeout_s=cfg.timeout_s,
                                     default_score=cfg.default_score, max_error_rate=cfg.max_error_rate) if specs else None
        self.rm = None
        if cfg.reward_model_path:
            from reinforge.rewards import RewardModelScorer

            # The reward model reads text with its own tokenizer (its vocabulary may differ from the policy's).
            self.rm = RewardModelScorer(cfg.reward_model_path, None, device=device)

    @staticmethod
    def _judge(cfg: RewardConfig, device: str):
        """The LLM judge that the reward.functions entry `judge` names (reward.judge)."""
        from reinforge.rewards.judge import JudgeScorer

        return JudgeScorer(cfg.judge, device=device)

    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """-> token_level_scores (B, T), acc (B,) in {0, 1}, response_text and reward_fn_scores
        (one {function name: score, None where a TRL-style function returned None} a sample);
        plus reward metrics."""
        from reinforge.rewards.episodes import env_scores, text_mask, turn_level_scores

        # A multi-turn episode (reinforge.agents.loop) is read whole, observations included.
        traj = batch["trajectory"] if "trajectory" in batch else None
        texts = decode_responses(self.tok, batch["responses"], text_mask(batch))
        prompts = batch["prompt_text"]
        scores = torch.zeros(len(batch)) if traj is None else env_scores(traj)
        metrics: dict[str, float] = {}
        if self.manager is not None:
            ids = [r[m.bool()].tolist() for r, m in zip(batch["responses"], text_mask(batch))]
            s, metrics = self.manager.score(prompts, texts, batch["ground_truth"], batch["extra"], completion_ids=ids,
                                            trajectories=traj)
            scores += torch.as_tensor(s, dtype=torch.float32)
        # Correctness is the rule-based score before shaping terms, so length-vs-correctness
        # diagnostics are not confused by penalties.
        acc = (scores > 0.5).float()
        if self.rm is not None:
            rm_scores = torch.as_tensor(self.rm.score(prompts, texts), dtype=torch.float32)
            scores += rm_scores
            metrics["reward/rm_score_mean"] = float(rm_scores.mean())
        group_ids = batch["group_ids"] if "group_ids" in batch else None
        scores, shaping = apply_shaping(scores, texts, batch["response_mask"].sum(-1), acc.bool(), group_ids,
                                        self.cfg, self.algo, self.T)
        metrics.update(shaping)
        per_fn = self.manager.last_scores if self.manager is not None else {}
        fn_scores = [{k: None if math.isnan(v[i]) else v[i] for k, v in per_fn.items()} for i in range(len(texts))]
        tls = scores_to_tokens(scores, batch["response_mask"]) if traj is None else turn_level_scores(
            scores, batch["response_mask"], traj, self.manager.last_turn_scores if self.manager else None)
        out = Batch({"token_level_scores": tls, "acc": acc,
                     "seq_scores": scores}, {"response_text": texts, "reward_fn_scores": fn_scores})
        return out, metrics

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
