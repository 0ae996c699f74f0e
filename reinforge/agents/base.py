"""What the agent loop, tools and environments agree on (issue 13).

An episode is one prompt row played out over turns. The policy generates a turn; the turn ends
at EOS, at a parser's stop string (a closed tool call), or when the token budget runs out. Tool
calls parsed from the turn run (concurrently), and their results are appended as *observation*
tokens; an environment's step(action) returns the next observation the same way. The trained
sequence is the prompt, then the generated token ids exactly as sampled, then the observation
ids, and so on: `response_mask` is 1 on generated tokens and 0 on observations.

The tag format for the built-in character tokenizer (parser name `tag`) is in
reinforge/tasks/tags.py, which the agent tasks' SFT demonstrations use too.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: `arguments` is the JSON object of the call; `raw` the text it came from.
    `error` is set (and the call not run) when the text was a malformed call (parsers.py)."""

    name: str
    arguments: dict
    raw: str = ""
    error: str = ""


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned, as the policy will read it. `error` is True when the tool raised,
    timed out, was unknown or got bad arguments (the text then says what went wrong)."""

    text: str
    error: bool = False
    latency_s: float = 0.0


@dataclass(frozen=True)
class Tool:
    """A Python function with an OpenAI function-calling description.

    `parameters` is the JSON schema of the arguments object ({"type": "object", "properties":
    {...}, "required": [...]}); `fn(**arguments) -> str`. `timeout_s` bounds one call.
    """

    name: str
    description: str
    parameters: dict
    fn: Callable[..., str]
    timeout_s: float = 10.0

    def schema(self) -> dict:
        """The OpenAI / chat-template `tools=` entry."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @property
    def first_param(self) -> str | None:
        """The parameter a tag-format call's ARG fills: the first required one, else the first."""
        props = list(self.parameters.get("properties", {}))
        required = [p for p in self.parameters.get("required", []) if p in props]
        return (required or props or [None])[0]


@dataclass(frozen=True)
class EnvStep:
    """An environment's answer to one action: the observation text to append (None or "" when
    there is nothing to show), the reward of this turn, and whether the episode is over."""

    observation: str | None
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment(ABC):
    """A multi-turn task that is not a tool call (a game, a user simulator). One instance plays
    one episode; the loop builds a fresh one per episode with the class's no-argument constructor
    (or a factory), so instances may keep state."""

    @abstractmethod
    def reset(self, row: dict) -> str:
        """Start the episode for dataset row `row`; returns the first observation (may be "":
        the prompt alone starts the episode)."""

    @abstractmethod
    def step(self, action: str) -> EnvStep:
        """The policy's turn `action` (decoded text of that turn) -> the environment's answer."""
