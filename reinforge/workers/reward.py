"""The reward worker: decode responses, score them, and place each score on the last valid token.

Rule-based functions go through `reinforge.rewards.RewardManager` (worker pool, timeouts, error
counting; the `judge` entry is reinforge.rewards.judge.JudgeScorer); correctness is decided by
the worker's rule (reinforge.rewards.correctness) on that rule-based score; a reward model adds
its score; then the shaping terms of reinforge.rewards.shaping (format, DAPO's soft overlong
punishment, length penalty, then the clip) in their registry's order. Everything comes back in
one RewardResult (reinforge.rewards.result).
"""
from __future__ import annotations

import torch

from reinforge.config.schema import AlgorithmConfig, RewardConfig
from reinforge.protocol import Batch
from reinforge.rewards.correctness import CorrectnessRule, correctness_rule
from reinforge.rewards.episodes import env_scores, text_mask, turn_level_scores, turn_rewards
from reinforge.rewards.result import RewardResult
from reinforge.rewards.shaping import Shaping, ShapingInput


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
        self.manager = RewardManager.from_config(specs, cfg) if specs else None
        # Chosen once: the threshold a function declares, else the default (rewards/correctness.py).
        self.correctness: CorrectnessRule = correctness_rule(self.manager.functions if self.manager else ())
        self.shaping = Shaping(cfg, algo, max_response_length)
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

    def score(self, batch: Batch) -> RewardResult:
        """Score B rollouts (responses (B, T), response_mask, prompt_text, ground_truth, extra;
        a multi-turn batch's trajectory) -> RewardResult; `.batch()` is what the step merges."""
        # A multi-turn episode (reinforge.agents.loop) is read whole, observations included.
        traj = batch["trajectory"] if "trajectory" in batch else None
        texts = decode_responses(self.tok, batch["responses"], text_mask(batch))
        prompts = batch["prompt_text"]
        scores = torch.zeros(len(batch)) if traj is None else env_scores(traj)
        fs = None
        if self.manager is not None:
            ids = [r[m.bool()].tolist() for r, m in zip(batch["responses"], text_mask(batch))]
            fs = self.manager.score(prompts, texts, batch["ground_truth"], batch["extra"], completion_ids=ids,
                                    trajectories=traj)
            scores += torch.as_tensor(fs.scores, dtype=torch.float32)
        # Correctness reads the rule-based score before the reward model and shaping terms, so
        # length-vs-correctness diagnostics are not confused by penalties.
        correct = self.correctness(scores, fs.reported_correct if fs else None)
        metrics = dict(fs.metrics) if fs else {}
        if self.rm is not None:
            rm_scores = torch.as_tensor(self.rm.score(prompts, texts), dtype=torch.float32)
            scores += rm_scores
            metrics["reward/rm_score_mean"] = float(rm_scores.mean())
        group_ids = batch["group_ids"] if "group_ids" in batch else None
        scores, shaping = self.shaping(scores, ShapingInput(texts, batch["response_mask"].sum(-1), correct, group_ids))
        metrics.update(shaping)
        fn_turns = fs.turn_scores if fs else None
        tls = scores_to_tokens(scores, batch["response_mask"]) if traj is None else turn_level_scores(
            scores, batch["response_mask"], traj, fn_turns)
        per_fn = {k: torch.tensor(v, dtype=torch.float64) for k, v in (fs.per_function if fs else {}).items()}
        return RewardResult(scores, tls, correct, texts, per_fn, None if traj is None else turn_rewards(traj, fn_turns),
                            metrics, dict(fs.weights) if fs else {})

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
