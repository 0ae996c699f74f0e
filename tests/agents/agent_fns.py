"""A tool and a reward for the agent end-to-end tests, importable by name (rollout.tools takes
`python:file.py:REV`, reward workers import `file.py:reversed_answer`); light imports only."""
from __future__ import annotations

from reinforge.agents.base import Tool

REV = Tool("rev", "Reverse a string.", {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]},
           fn=lambda s: s[::-1])


def reversed_answer(prompt, response, ground_truth, trajectory=None, **extra) -> float:
    """1 when the episode's last turn is the ground truth (the reversed digits)."""
    last = trajectory["messages"][-1]
    return float(last["role"] == "assistant" and last["content"].strip() == str(ground_truth))
