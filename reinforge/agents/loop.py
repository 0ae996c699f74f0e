"""The agent rollout (`rollout.max_turns` > 1): multi-turn episodes with tools or an environment.

All episodes of a batch advance together: each turn is one batched generate call over the
episodes still active (`continue_ids` of the lean / hf / vllm engine, each row continuing its own prompt
plus everything so far, up to the tokens it has left); a turn ends at EOS, at a parser stop
string (a closed tool call) or at the budget. Then every episode's calls are parsed and all calls
of the turn run at once (agents.executor), or the environment steps on the turn's text, and the
answer is appended as observation tokens. An episode ends at a final answer (a turn without a
call; an environment's done), at `max_turns`, or when the budget `rollout.max_response_length`
(every generated and observation token after the prompt) runs out.

Token-in, token-out: the response is the generated ids exactly as sampled, then the observation
ids, and so on: no text is ever re-encoded except tool / environment answers. The Batch is the
single-turn rollout's (reinforge.workers.rollout.common.assemble_rollout) with:
- response_mask (B, T) 1 on generated tokens, 0 on observations and padding; attention_mask
  covers both (so observations are read in every forward, and positions stay contiguous);
- rollout_log_probs (B, T) on generated tokens; truncated (B,) episodes that hit a limit
  (max_turns with a call pending, or the budget) before a final answer;
- non-tensor `trajectory` (B,): one dict an episode, what reward functions receive (keyword
  `trajectory`) and the agent metrics read: messages ({"role": "assistant" | "tool" | "user",
  "content"}), calls (turn, name, arguments, error, latency_s of each tool call), turns,
  turn_ends (response index of each turn's last generated token),
  turn_rewards (an environment's, 0.0 per turn without one), tool_calls, tool_errors,
  tool_latency_s, truncated, budget_exhausted.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable

import torch

from reinforge.agents.base import Environment, Tool
from reinforge.agents.executor import run_tool_calls
from reinforge.protocol import Batch
from reinforge.rewards.styles import public_extra
from reinforge.workers.rollout.base import RolloutCapabilities, WrappingRollout
from reinforge.workers.rollout.common import assemble_rollout, pad_prompts, sampling_meta


@dataclass
class Episode:
    prompt: list[int]
    tools: dict[str, Tool]
    env: Environment | None = None
    ids: list[int] = field(default_factory=list)  # the response so far: generated + observations
    gen: list[int] = field(default_factory=list)  # 1 where generated
    logp: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    last_turn: list[int] = field(default_factory=list)  # the ids of the latest generated turn
    calls: list[dict] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: float = 0.0
    done: bool = False
    truncated: bool = False
    budget_exhausted: bool = False

    def trajectory(self) -> dict:
        return {"messages": self.messages, "calls": self.calls, "turns": len(self.turn_ends),
                "turn_ends": self.turn_ends, "turn_rewards": self.turn_rewards, "tool_calls": self.tool_calls,
                "tool_errors": self.tool_errors, "tool_latency_s": self.tool_latency_s, "truncated": self.truncated,
                "budget_exhausted": self.budget_exhausted}


class StopScanner:
    """Whether a turn's ids so far contain a stop string: the tail of the turn is decoded each
    step (a stop string ends in the last token the first time it appears)."""

    def __init__(self, tokenizer, stop_strings: list[str]):
        self.tok, self.stops = tokenizer, [s for s in stop_strings if s]
        # Tokens hold at least one character, except byte pieces of one character: 4 per char covers both.
        self.window = 4 * max((len(s) for s in self.stops), default=0)
        self.last_chars = {s[-1] for s in self.stops}
        self.may_end: dict[int, bool] = {}  # token id -> whether its text can complete a stop string

    def _may_end(self, token: int) -> bool:
        """Only a token holding a stop string's last character (or a partial byte) can complete one."""
        if token not in self.may_end:
            text = self.tok.decode([token], skip_special_tokens=False)
            self.may_end[token] = "\ufffd" in text or any(c in text for c in self.last_chars)
        return self.may_end[token]

    def hit(self, ids: list[int]) -> bool:
        if not self.stops or not ids or not self._may_end(ids[-1]):
            return False
        text = self.tok.decode(ids[-self.window:], skip_special_tokens=False)
        return any(s in text for s in self.stops)

    def first_cut(self, ids: list[int]) -> int:
        """The length of `ids` up to and including the token completing the first stop string."""
        for k in range(1, len(ids) + 1):
            if self.hit(ids[:k]):
                return k
        return len(ids)


@dataclass
class TurnStops:
    """Where each row of one generate call must end its turn (besides EOS): after `budgets[r]`
    tokens, or at a stop string of `scanners[r]`. The lean loop calls it every step with the
    rows still decoding (rows (k,)) and the ids so far (b, t) -> (k,) bool; engines that take
    per-row limits instead (vLLM: max_tokens, stop) read `budgets` and `stop_strings`."""

    budgets: list[int]
    scanners: list[StopScanner]

    @property
    def stop_strings(self) -> list[list[str]]:
        return [s.stops for s in self.scanners]

    def __call__(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        return torch.as_tensor([t >= self.budgets[r] or self.scanners[r].hit(ids[r].tolist()) for r in rows.tolist()])


def row_tool_names(value) -> list[str] | None:
    """A row's `tools` column as a list of names (None: the row names none): a list, or a JSON
    list as a string."""
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    return [str(v) for v in value]


class AgentRollout(WrappingRollout):
    """`generate(prompts, n, temperature, greedy)` as the single-turn rollouts, over episodes: a
    Rollout (workers/rollout/base.py) wrapping one. Its capabilities, `model` and `generator` are
    the inner engine's, so the asynchronous producer and a Ray rank never look inside.

    inner: a Rollout whose capabilities say it `continues` (lean, hf, vllm; its continue_ids, P, T,
    eos_ids, top_k, top_p, micro_batch_size);
    tools: {name: Tool} for every row (a row's `tools` column of names replaces it, resolved by
    `resolve_tools`, by default agents.tools.load_tools); env_factory: a no-argument factory of
    Environments (then tool calls are not parsed: the environment answers every turn; its
    reset() text is appended after the prompt, so with hermes it should return "" and the first
    message belong in the prompt); parser: an agents.parsers parser."""

    def __init__(self, inner, tokenizer, *, max_turns: int, parser, tools: dict[str, Tool] | None = None,
                 env_factory: Callable[[], Environment] | None = None,
                 resolve_tools: Callable[[list[str]], dict[str, Tool]] | None = None):
        self.wrap(inner)  # P, T, model, generator, continue_ids, sync_weights: the inner engine's
        self.tok, self.max_turns, self.parser = tokenizer, max_turns, parser
        self.tools, self.env_factory = tools or {}, env_factory
        self.resolve_tools = resolve_tools or _cached_load_tools
        self.eos_ids = set(inner.eos_ids)
        self.scanners: dict[tuple, StopScanner] = {}

    # ---- the Rollout protocol: the inner engine's ---------------------------------------------
    @property
    def capabilities(self) -> RolloutCapabilities:
        """The inner engine's, less `per_prompt_seeds`: generate takes no seeds here, so a Ray
        rank seeds torch before each prompt's episodes (distributed/engine.py), which is where
        the lean loop samples from and where vLLM's continue_ids draws its rows' seeds."""
        return replace(self.inner.capabilities, per_prompt_seeds=False)

    def with_model(self, model) -> "AgentRollout":
        """This loop around the inner engine generating with `model` (tools and scanners shared)."""
        twin = copy.copy(self)
        twin.inner = self.inner.with_model(model)
        return twin

    def _scanner(self, stop_strings: list[str]) -> StopScanner:
        """One scanner per set of stop strings for the whole run (it caches per-token answers)."""
        key = tuple(stop_strings)
        if key not in self.scanners:
            self.scanners[key] = StopScanner(self.tok, list(key))
        return self.scanners[key]

    # ---- episodes -------------------------------------------------------------------------
    def _episode(self, prompt_ids: list[int], row: dict) -> Episode:
        names = row_tool_names(row.get("tools"))
        tools = self.tools if names is None else self.resolve_tools(names)
        ep = Episode(list(prompt_ids), tools, self.env_factory() if self.env_factory else None)
        if ep.env is not None:
            first = ep.env.reset(row)
            if first:
                ep.messages.append({"role": "user", "content": first})
                self._observe(ep, self.parser.observation_ids(self.tok, ep.messages[-1:], ""))
        return ep

    def _observe(self, ep: Episode, obs: list[int]) -> None:
        """Append observation ids, cut to the budget (which then ends the episode)."""
        left = self.T - len(ep.ids)
        if len(obs) >= left:
            ep.budget_exhausted = ep.truncated = ep.done = True
        obs = obs[:left]
        ep.ids += obs
        ep.gen += [0] * len(obs)
        ep.logp += [0.0] * len(obs)

    def _turn(self, eps: list[Episode], greedy: bool,
              sampling: tuple[float, int, float]) -> list[tuple[list[int], list[float]]]:
        """One generate call (per micro-batch) over `eps` -> each episode's turn ids and log-probs,
        cut at its first EOS, stop string or its budget (the lean engine also stops there)."""
        out = []
        step = max(1, self.inner.micro_batch_size)
        for i in range(0, len(eps), step):
            part = eps[i:i + step]
            stops = TurnStops([self.T - len(e.ids) for e in part],
                              [self._scanner(self.parser.stop_strings(e.tools) if e.env is None else []) for e in part])
            ids, logp = self.inner.continue_ids([e.prompt + e.ids for e in part], max(stops.budgets), greedy=greedy,
                                                sampling=sampling, stop=stops)
            for row, budget in enumerate(stops.budgets):
                turn = ids[row, :budget].tolist()
                end = next((k + 1 for k, t in enumerate(turn) if t in self.eos_ids), len(turn))
                end = stops.scanners[row].first_cut(turn[:end])
                out.append((turn[:end], logp[row, :end].tolist()))
        return out

    def _after_turn(self, ep: Episode, turn: list[int], logp: list[float], n_turn: int) -> list:
        """Record a generated turn; -> the calls to run ([] when the episode is over)."""
        ep.ids += turn
        ep.gen += [1] * len(turn)
        ep.logp += logp
        ep.turn_ends.append(len(ep.ids) - 1)
        ep.last_turn = turn
        text = self.tok.decode(turn, skip_special_tokens=True)
        ep.messages.append({"role": "assistant", "content": text})
        left = self.T - len(ep.ids)
        ended = bool(turn) and turn[-1] in self.eos_ids
        if ep.env is not None:
            res = ep.env.step(text)
            ep.turn_rewards.append(float(res.reward))
            if res.done:
                ep.done = True
            elif left <= 0:
                ep.done = ep.truncated = ep.budget_exhausted = True
            elif n_turn == self.max_turns:
                ep.done = ep.truncated = True
            elif res.observation:
                ep.messages.append({"role": "user", "content": res.observation})
                self._observe(ep, self.parser.observation_ids(self.tok, ep.messages[-1:],
                                                              self.tok.decode(turn, skip_special_tokens=False)))
            return []
        ep.turn_rewards.append(0.0)
        # Parsed with special tokens kept: a template may make <tool_call> a special token.
        calls = self.parser.parse(self.tok.decode(turn, skip_special_tokens=False), ep.tools) if ep.tools else []
        if not calls:  # a final answer, or the budget ran out mid-answer
            ep.done = True
            if not ended and left <= 0:
                ep.truncated = ep.budget_exhausted = True
        elif left <= 0:
            ep.done = ep.truncated = ep.budget_exhausted = True
        elif n_turn == self.max_turns:
            ep.done = ep.truncated = True
        return [] if ep.done else calls

    # ---- the rollout ----------------------------------------------------------------------
    def generate(self, prompts: Batch, *, n: int, temperature: float = 1.0, greedy: bool = False) -> Batch:
        """The single-turn rollouts' Batch (module doc), one episode a (prompt, sample)."""
        meta = sampling_meta(temperature, self.inner.top_k, self.inner.top_p, greedy)
        sampling = (meta["temperature"], meta["top_k"], meta["top_p"])
        # What reset(row) and a row's `tools` see: the dataset's other columns, the rendered prompt,
        # the ground truth (from reward_model.ground_truth too) and the data source.
        rows = [{**public_extra(prompts["extra"][i] or {}), "prompt": prompts["prompt_text"][i],
                 "ground_truth": prompts["ground_truth"][i], "data_source": prompts["data_source"][i]}
                for i in range(len(prompts))]
        eps = [self._episode(prompts["prompt_ids"][i], rows[i]) for i in range(len(prompts)) for _ in range(n)]
        for n_turn in range(1, self.max_turns + 1):
            active = [e for e in eps if not e.done]
            if not active:
                break
            turns = self._turn(active, greedy, sampling)
            pending = [(e, self._after_turn(e, ids, lp, n_turn)) for e, (ids, lp) in zip(active, turns)]
            pending = [(e, calls) for e, calls in pending if calls]
            flat = [(c, e.tools) for e, calls in pending for c in calls]
            results = iter(run_tool_calls([c for c, _ in flat], [t for _, t in flat]))
            for e, calls in pending:
                got = [next(results) for _ in calls]
                e.tool_calls += len(calls)
                e.tool_errors += sum(r.error for r in got)
                e.tool_latency_s += sum(r.latency_s for r in got)
                msgs = [{"role": "tool", "name": c.name, "content": r.text} for c, r in zip(calls, got)]
                e.calls += [{"turn": len(e.turn_ends) - 1, "name": c.name, "arguments": c.arguments, "error": r.error,
                             "latency_s": r.latency_s} for c, r in zip(calls, got)]
                e.messages += msgs
                turn_text = self.tok.decode(e.last_turn, skip_special_tokens=False)
                self._observe(e, self.parser.observation_ids(self.tok, msgs, turn_text))
        return self._assemble(prompts, eps, n, meta)

    def _assemble(self, prompts: Batch, eps: list[Episode], n: int, meta: dict) -> Batch:
        B, pad = len(eps), self.tok.pad_token_id
        resp = torch.full((B, self.T), pad, dtype=torch.long)
        gen = torch.zeros(B, self.T, dtype=torch.long)
        valid = torch.zeros(B, self.T, dtype=torch.long)
        logp = torch.zeros(B, self.T)
        for i, e in enumerate(eps):
            L = len(e.ids)
            resp[i, :L], gen[i, :L], valid[i, :L] = torch.as_tensor(e.ids, dtype=torch.long), torch.as_tensor(e.gen), 1
            logp[i, :L] = torch.as_tensor(e.logp)
        ids, mask = pad_prompts(prompts["prompt_ids"], self.P, pad)
        truncated = torch.as_tensor([e.truncated for e in eps], dtype=torch.bool)
        out = assemble_rollout(prompts, ids, mask, resp, gen, truncated, n, meta, {"rollout_log_probs": logp * gen})
        out["attention_mask"] = torch.cat([mask.repeat_interleave(n, 0), valid], dim=1)
        out["trajectory"] = [e.trajectory() for e in eps]
        return out


def agent_parts(r) -> tuple[dict[str, Tool], Callable[[], Environment] | None]:
    """rollout.tools and rollout.env (a RolloutConfig) resolved: ConfigError naming the key when a
    tool or the environment cannot be imported (run by the preflight, before any model loads)."""
    from reinforge.agents.envs import load_env
    from reinforge.agents.tools import load_tool
    from reinforge.config.load import ConfigError

    tools: dict[str, Tool] = {}
    for i, spec in enumerate(r.tools):
        try:
            tool = load_tool(spec)
        except ConfigError as exc:
            raise ConfigError(f"rollout.tools[{i}]: {exc}") from None
        if tool.name in tools:
            raise ConfigError(f"rollout.tools[{i}]: a second tool named '{tool.name}'; tool names must be unique")
        tools[tool.name] = tool
    try:
        env = load_env(r.env) if r.env else None
    except ConfigError as exc:
        raise ConfigError(f"rollout.env: {exc}") from None
    return tools, env


def _cached_load_tools(names: list[str]) -> dict[str, Tool]:
    """agents.tools.load_tools, once per list of names."""
    return _load_tools_once(tuple(names))


@lru_cache(maxsize=None)
def _load_tools_once(names: tuple) -> dict[str, Tool]:
    from reinforge.agents.tools import load_tools

    return load_tools(list(names))


def make_agent_rollout(r, inner, tokenizer) -> AgentRollout:
    """The AgentRollout of a RolloutConfig around a lean / hf / vllm rollout."""
    from reinforge.agents.parsers import get_parser

    tools, env = agent_parts(r)
    return AgentRollout(inner, tokenizer, max_turns=r.max_turns, parser=get_parser(r.tool_parser), tools=tools,
                        env_factory=env)


def episode_metrics(trajectories: list[dict], prefix: str = "agent/") -> dict[str, float]:
    """Means over a batch's episodes: turns, tool calls, tool errors (per episode), tool latency
    (seconds per call), and the fractions of episodes truncated (a limit before a final answer)
    and out of tokens."""
    n = max(len(trajectories), 1)
    calls = sum(t["tool_calls"] for t in trajectories)
    return {f"{prefix}turns_mean": sum(t["turns"] for t in trajectories) / n,
            f"{prefix}tool_calls_mean": calls / n,
            f"{prefix}tool_errors": sum(t["tool_errors"] for t in trajectories) / n,
            f"{prefix}tool_latency_s": sum(t["tool_latency_s"] for t in trajectories) / max(calls, 1),
            f"{prefix}truncated_episodes": sum(t["truncated"] for t in trajectories) / n,
            f"{prefix}budget_exhausted": sum(t["budget_exhausted"] for t in trajectories) / n,
            **gateway_metrics(trajectories, prefix)}


def gateway_metrics(trajectories: list[dict], prefix: str) -> dict[str, float]:
    """rollout.agent's rows (reinforge.gateway.rollout): the means of the agents' own metrics
    ({prefix}metrics/NAME) and the counts of their round ({prefix}gateway/..., the same dict on
    every row of a round: runs, dropped_<reason>, calls, edited_calls, forks, sequences)."""
    out: dict[str, float] = {}
    names = sorted({k for t in trajectories for k in t.get("agent_metrics", {})})
    for k in names:
        vals = [t["agent_metrics"][k] for t in trajectories if k in t.get("agent_metrics", {})]
        out[f"{prefix}metrics/{k}"] = sum(vals) / len(vals)
    rounds = {id(t["gateway"]): t["gateway"] for t in trajectories if "gateway" in t}
    for k in sorted({k for g in rounds.values() for k in g}):
        out[f"{prefix}gateway/{k}"] = float(sum(g.get(k, 0.0) for g in rounds.values()))
    return out


def prompt_tools(r) -> Callable:
    """row's `tools` column (or None) -> the OpenAI schemas of its tools (rollout.tools when the
    row names none): what a hermes chat template renders into the prompt (`tools=`)."""
    tools, _ = agent_parts(r)
    default = [t.schema() for t in tools.values()]

    def schemas(value) -> list[dict]:
        # Every row names its tools: resolve each list once (as the loop does), not once a row.
        names = row_tool_names(value)
        return default if names is None else [t.schema() for t in _cached_load_tools(names).values()]

    return schemas
