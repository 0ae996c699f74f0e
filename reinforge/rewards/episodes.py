"""Rewards of multi-turn episodes (the Batch of reinforge.agents.loop): what text reward
functions read, an environment's per-turn rewards, and where per-turn rewards sit. (In the
rewards layer, below workers/reward.py, which calls it: it reads the batch, not the agent loop.)

A reward function reads the whole response, observations included (the episode as the policy
saw it; `trajectory["messages"]` holds the turns apart). An episode's score is the reward
functions' (and reward model's, shaping's) score plus its environment's turn rewards. In
`token_level_scores` each per-turn reward (an environment's, or a reward function's that
returned one value per turn) sits on the last generated token of its turn; the rest of the
score on the last generated token of the episode, as for a single turn.
"""
from __future__ import annotations

import torch

from reinforge.protocol import Batch


def text_mask(batch: Batch) -> torch.Tensor:
    """(B, T) the tokens whose text reward functions read: generated and observation tokens of
    an episode, the response_mask of a single-turn batch."""
    if "trajectory" not in batch:
        return batch["response_mask"]
    return batch["attention_mask"][:, batch["prompts"].shape[1]:]


def env_scores(trajectories: list[dict]) -> torch.Tensor:
    """(B,) the sum of each episode's environment turn rewards (0 without an environment)."""
    return torch.as_tensor([float(sum(t["turn_rewards"])) for t in trajectories], dtype=torch.float32)


def turn_rewards(trajectories: list[dict], fn_turn_scores: list | None) -> list[list[float]]:
    """Per episode, the reward of each turn: its environment's turn reward plus fn_turn_scores[i]
    (the reward functions' weighted per-turn values, a list per episode or None)."""
    out = []
    for i, t in enumerate(trajectories):
        turn = list(t["turn_rewards"])
        fn_turns = fn_turn_scores[i] if fn_turn_scores else None
        out.append(turn if fn_turns is None else [a + b for a, b in zip(turn, fn_turns)])
    return out


def turn_level_scores(scores: torch.Tensor, response_mask: torch.Tensor, trajectories: list[dict],
                      fn_turn_scores: list | None) -> torch.Tensor:
    """scores (B,) the episodes' whole scores -> (B, T): each turn's reward (turn_rewards) on its
    turn's last generated token, the rest of the score on the episode's last generated token."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = response_mask.long().cumsum(-1).argmax(-1)  # the last generated token (0 for an empty row)
    for i, (t, turn) in enumerate(zip(trajectories, turn_rewards(trajectories, fn_turn_scores))):
        for end, r in zip(t["turn_ends"], turn):
            out[i, end] += r
        out[i, last[i]] += float(scores[i]) - sum(turn)
    return out * response_mask
