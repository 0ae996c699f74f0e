"""`rollout.agent=path/agent.py:run`: the user's agent as the rollout (docs/agents.md, "Bring your
own agent").

generate(prompts, n) runs the agent n times per prompt row, up to `rollout.agent_concurrency` at
once, each in its own daemon thread: `run(base_url, api_key, row)` (a function, or an async one,
run in its thread's own event loop) talks to the model gateway (server.py) through the base URL
of its rollout, http://127.0.0.1:PORT/rollouts/<id>/v1, and returns its reward: a number, or a
dict {"reward": number, "metrics": {name: number}}. Each run has `rollout.agent_timeout_s` from
its start; one that passes it is ended (its later calls are refused) and dropped, one that raises
or returns something else is dropped, one that never called the model is dropped: each counted,
none stalls the step (a hung thread is left behind as a daemon, never joined).

A finished run's calls are rebuilt into sequences (capture.py). Rows: B = B0 * n first, run j of
prompt i at row i * n + j, as the built-in rollouts order them:
- a kept run's row is the sequence holding its last call (usually its only one);
- a dropped run's row is void: its dataset prompt, no response token (response_mask 0), score 0,
  and a group id of its own (-1, -2, ...), so it moves no gradient and no other run's advantage;
  its trajectory says `dropped` (timeout, raised, bad_return, no_calls, edited, empty);
- a run whose calls rebuild into several sequences (an edited history or a fork) follows
  `rollout.agent_history`: split, its other sequences become extra rows after the B rows, with
  its reward and group id; drop, the run is dropped.
The Batch is the agent loop's (agents/loop.py): prompts (rows, P) the first call's prompt ids,
responses (rows, T) every later id, response_mask 1 on sampled ids only, rollout_log_probs (the
captured log-probs), token_versions (rows, T: each sampled id's weight-version stamp), and
a `trajectory` per row whose single turn reward is the agent's reward on the last sampled token
(what the reward worker scores; reward.functions, when set, add to it) plus `gateway`: the
round's counts (agents/loop.gateway_metrics logs them as agent/gateway/...).
"""
from __future__ import annotations

import asyncio
import copy
import inspect
import math
import queue
import secrets
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from reinforge.gateway.capture import rebuild
from reinforge.protocol import Batch
from reinforge.rewards.styles import public_extra
from reinforge.workers.rollout.base import RolloutCapabilities, WrappingRollout
from reinforge.workers.rollout.common import pad_prompts, sampling_meta

DROP_REASONS = ("timeout", "raised", "bad_return", "no_calls", "edited", "empty")


@dataclass
class AgentRun:
    rid: str
    index: int
    """The prompt row it plays."""
    row: dict
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None
    started: float = 0.0
    status: str = "pending"


def call_agent(fn, base_url: str, api_key: str, row: dict, run: AgentRun, finished: queue.Queue) -> None:
    """A run's thread: the agent's return value or exception into `run`, then its id into `finished`."""
    try:
        res = fn(base_url, api_key, row)
        if inspect.isawaitable(res):
            async def wait():
                return await res
            res = asyncio.run(wait())
        run.result = res
    except BaseException as e:  # noqa: BLE001 - an agent's failure is its run's outcome
        run.error = e
    finally:
        run.done.set()
        finished.put(run.rid)


def parse_result(res) -> tuple[float, dict[str, float]]:
    """The agent's return value -> (reward, metrics); ValueError if it is neither a finite number
    nor {"reward": number, "metrics": {name: number}}."""
    metrics = {}
    if isinstance(res, dict):
        metrics = res.get("metrics") or {}
        if not isinstance(metrics, dict) or not all(isinstance(v, (int, float)) for v in metrics.values()):
            raise ValueError("metrics must be a dict of numbers")
        res = res.get("reward")
    if isinstance(res, bool) or not isinstance(res, (int, float)) or not math.isfinite(res):
        raise ValueError(f"an agent returns a finite number or {{'reward': number, 'metrics': {{...}}}}, got {res!r}")
    return float(res), {str(k): float(v) for k, v in metrics.items()}


class RolloutInterrupted(Exception):
    """generate() was interrupted (GatewayRollout.interrupt)."""


class GatewayRollout(WrappingRollout):
    """A Rollout (workers/rollout/base.py) running user agents against the gateway over `inner`
    (a lean / hf / vllm engine); `model`, `generator` and weight syncs are the inner engine's."""

    def __init__(self, inner, tokenizer, agent, *, parser, concurrency: int = 64, timeout_s: float = 300.0,
                 history: str = "split", model_name: str = "policy"):
        from reinforge.gateway.server import Gateway

        self.wrap(inner)  # P, T, model, generator, continue_ids: the inner engine's
        self.tok, self.agent = tokenizer, agent
        self.concurrency, self.timeout_s, self.history = concurrency, timeout_s, history
        self.api_key = secrets.token_hex(16)
        self.gateway = Gateway(inner, tokenizer, parser, model_name=model_name, api_key=self.api_key)
        # async_ok: the asynchronous producer's behaviour copy is this wrapper over the inner
        # engine's copy (with_model), serving its own gateway; a Ray rank runs its share in one call
        self.capabilities = RolloutCapabilities(continues=False, records_log_probs=True, seed_by_prompt=False,
                                                async_ok=inner.capabilities.async_ok)
        self._round = 0
        self._stop = threading.Event()  # interrupt(): end the round in progress now
        self._finished: queue.Queue | None = None
        self._void = 0  # dropped runs so far: their rows' group ids are -1, -2, ...

    def sync_weights(self, actor_model) -> None:
        """The inner engine's sync; later calls are stamped one weight version later (until a
        generate() names its version: prompts.meta["policy_version"])."""
        super().sync_weights(actor_model)
        self.gateway.version += 1

    def with_model(self, model) -> "GatewayRollout":
        """The same agents against a gateway of their own over the inner engine generating with
        `model` (the asynchronous producer's behaviour copy); the API key is shared."""
        from reinforge.gateway.server import Gateway

        twin = copy.copy(self)
        twin.wrap(self.inner.with_model(model))
        twin.gateway = Gateway(twin.inner, self.tok, self.gateway.parser, model_name=self.gateway.model_name,
                               api_key=self.api_key)
        twin._stop, twin._finished = threading.Event(), None
        return twin

    def interrupt(self) -> None:
        """End the round in progress now (the asynchronous producer's stop): its runs are ended
        like a deadline's and generate() raises RolloutInterrupted; later rounds raise it too."""
        self._stop.set()
        if self._finished is not None:
            self._finished.put(None)

    def close(self) -> None:
        self.gateway.close()

    # ---- the rollout ----------------------------------------------------------------------
    def generate(self, prompts: Batch, *, n: int, temperature: float = 1.0, greedy: bool = False) -> Batch:
        """B0 prompt rows -> B0 * n rows, then any extra split sequences (module doc).
        prompts.meta["policy_version"], when given, is the version of the weights generating (the
        trainer's completed steps): every call is stamped with it."""
        if self.gateway.port is None:
            self.gateway.start()
        if prompts.meta.get("policy_version") is not None:
            self.gateway.version = int(prompts.meta["policy_version"])
        meta = sampling_meta(temperature, self.inner.top_k, self.inner.top_p, greedy)
        self.gateway.sampling = (meta["temperature"], meta["top_k"], meta["top_p"])
        self.gateway.greedy = greedy
        self._round += 1
        rows = [{**public_extra(prompts["extra"][i] or {}),
                 "prompt": prompts["prompt_raw"][i] if "prompt_raw" in prompts else prompts["prompt_text"][i],
                 "prompt_text": prompts["prompt_text"][i], "ground_truth": prompts["ground_truth"][i],
                 "data_source": prompts["data_source"][i]} for i in range(len(prompts))]
        runs = [AgentRun(f"g{self._round}-{i}-{k}-{secrets.token_hex(4)}", i, dict(rows[i]))
                for i in range(len(prompts)) for k in range(n)]
        counts = {r: 0 for r in DROP_REASONS} | {"edited_calls": 0, "forks": 0, "calls": 0}
        errors_before = self.gateway.counters["errors"]
        logs = self._run_all(runs, counts)
        if not self.gateway.drain():  # a late call of an abandoned agent must not outlive the round
            print("[reinforge] rollout.agent: the gateway still generates for ended rollouts after 60 s",
                  file=sys.stderr)
        primary, extra = [], []  # (run, reward, metrics, sequence or None, call turns)
        for run in runs:
            log = logs[run.rid]
            counts["calls"] += len(log.calls)
            reason, seqs = self._outcome(run, log, counts)
            if reason is not None:
                counts[reason] += 1
                primary.append((run, 0.0, {}, None, [], reason))
                continue
            reward, metrics = parse_result(run.result)
            # the sequence holding the run's last call is its row; split: the others follow the B rows
            primary.append((run, reward, metrics, seqs[-1], log.call_turns, None))
            extra += [(run, reward, metrics, s, log.call_turns, None) for s in seqs[:-1]]
        dropped = sum(counts[k] for k in DROP_REASONS)
        summary = {"runs": float(len(runs)), **{f"dropped_{k}" if k in DROP_REASONS else k: float(v)
                                                 for k, v in counts.items()},
                   "dropped": float(dropped), "sequences": float(len(runs) - dropped + len(extra)),
                   "gateway_errors": float(self.gateway.counters["errors"] - errors_before)}  # this round's
        if dropped == len(runs):
            print(f"[reinforge] rollout.agent: every one of {len(runs)} runs was dropped "
                  f"({', '.join(f'{k}: {counts[k]}' for k in DROP_REASONS if counts[k])})", file=sys.stderr)
        return self._assemble(prompts, primary + extra, meta, summary)

    def _outcome(self, run: AgentRun, log, counts: dict) -> tuple[str | None, list]:
        """(why the run is dropped or None, its sequences)."""
        if run.status != "done":
            return run.status, []
        try:
            parse_result(run.result)
        except ValueError:
            return "bad_return", []
        if not log.calls:
            return "no_calls", []
        rb = rebuild(log.calls)
        counts["edited_calls"] += rb.edited
        counts["forks"] += rb.forks
        if len(rb.sequences) > 1 and self.history == "drop":
            return "edited", []
        seqs = [s for s in rb.sequences if any(s.mask[:self.T])]
        return (None, seqs) if seqs and seqs[-1] is rb.sequences[-1] else ("empty", [])

    def _run_all(self, runs: list[AgentRun], counts: dict) -> dict:
        """Run every agent (concurrency, deadlines: module doc) -> {rid: its RolloutLog}."""
        finished: queue.Queue = queue.Queue()
        self._finished = finished
        pending, active, logs = deque(runs), {}, {}
        while pending or active:
            if self._stop.is_set():
                for rid in active:
                    self.gateway.end_rollout(rid)
                raise RolloutInterrupted("the gateway rollout was interrupted")
            while pending and len(active) < self.concurrency:
                run = pending.popleft()
                self.gateway.open_rollout(run.rid, budget=self.T, prompt_limit=self.P)
                run.started, run.status = time.monotonic(), "running"
                threading.Thread(target=call_agent, daemon=True, name=f"agent-{run.rid}",
                                 args=(self.agent, self.gateway.base_url(run.rid), self.api_key, run.row, run,
                                       finished)).start()
                active[run.rid] = run
            now = time.monotonic()
            wait = max(0.0, min(r.started + self.timeout_s for r in active.values()) - now)
            try:
                finished.get(timeout=wait)
            except queue.Empty:
                pass
            now = time.monotonic()
            for rid, run in list(active.items()):
                if run.done.is_set():
                    run.status = "raised" if run.error is not None else "done"
                elif now - run.started >= self.timeout_s:
                    run.status = "timeout"  # its thread is abandoned; its later calls are refused
                else:
                    continue
                logs[rid] = self.gateway.end_rollout(rid)
                del active[rid]
        return logs

    def _assemble(self, prompts: Batch, rows_in: list, meta: dict, summary: dict) -> Batch:
        """rows_in: (run, reward, metrics, sequence or None (dropped), call turns, drop reason)."""
        B, T, pad = len(rows_in), self.T, self.tok.pad_token_id
        resp = torch.full((B, T), pad, dtype=torch.long)
        gen = torch.zeros(B, T, dtype=torch.long)
        valid = torch.zeros(B, T, dtype=torch.long)
        logp = torch.zeros(B, T)
        versions = torch.full((B, T), self.gateway.version, dtype=torch.long)
        truncated = torch.zeros(B, dtype=torch.bool)
        trajectories, prompt_lists = [], []
        src = [run.index for run, *_ in rows_in]
        rows = prompts.index(src)
        group_ids = rows["uid"].clone()
        for i, (run, reward, metrics, s, call_turns, reason) in enumerate(rows_in):
            if s is None:  # a dropped run: no trained token, a group of its own (advantage 0)
                self._void += 1
                group_ids[i] = -self._void
                prompt_lists.append(list(prompts["prompt_ids"][run.index]))
                trajectories.append({"messages": [], "calls": [], "turns": 0, "turn_ends": [0], "turn_rewards": [0.0],
                                     "tool_calls": 0, "tool_errors": 0, "tool_latency_s": 0.0, "truncated": False,
                                     "budget_exhausted": False, "dropped": reason, "gateway": summary})
                continue
            L = min(len(s.response_ids), T)
            resp[i, :L] = torch.as_tensor(s.response_ids[:L], dtype=torch.long)
            gen[i, :L] = torch.as_tensor(s.mask[:L])
            valid[i, :L] = 1
            logp[i, :L] = torch.as_tensor(s.log_probs[:L])
            versions[i] = row_versions(s.versions[:L], T)
            truncated[i] = len(s.response_ids) > T or s.finish == "length"
            prompt_lists.append(list(s.prompt_ids))
            turn = call_turns[s.calls[-1]] if s.calls[-1] < len(call_turns) else None
            chain_turns = [call_turns[k] for k in s.calls if k < len(call_turns) and call_turns[k] is not None]
            trajectories.append({"messages": [] if turn is None else [*turn.messages, turn.assistant], "calls": [],
                                 "turns": len(s.calls), "turn_ends": [int(gen[i].nonzero()[-1])],
                                 "turn_rewards": [reward],
                                 "tool_calls": sum(len(t.assistant.get("tool_calls", [])) for t in chain_turns),
                                 "tool_errors": 0, "tool_latency_s": 0.0, "truncated": bool(truncated[i]),
                                 "budget_exhausted": len(s.response_ids) >= T, "agent_metrics": metrics,
                                 "gateway": summary, "weight_versions": sorted({v for v in s.versions if v >= 0})})
        ids, mask = pad_prompts(prompt_lists, self.P, pad) if B else \
            (torch.zeros(0, self.P, dtype=torch.long), torch.zeros(0, self.P, dtype=torch.long))
        out = Batch({"prompts": ids, "responses": resp, "input_ids": torch.cat([ids, resp], dim=1),
                     "attention_mask": torch.cat([mask, valid], dim=1), "response_mask": gen,
                     "group_ids": group_ids, "truncated": truncated, "rollout_log_probs": logp * gen,
                     "token_versions": versions},
                    dict(rows.non_tensors), meta)
        out = out | rows.select([k for k in rows.tensors if k != "uid"])
        out["trajectory"] = trajectories
        out["prompt_ids"] = prompt_lists  # each row's first call's prompt, not the dataset's rendering
        return out


def row_versions(stamped: list[int], T: int) -> torch.Tensor:
    """A sequence's per-token weight versions (capture.Sequence.versions: -1 on the harness's
    ids) -> (T,) token_versions: each sampled id's stamp; a harness id, and the padding after
    the sequence, the version of the sampled id before it (the oldest stamp before the first)."""
    sampled = [v for v in stamped if v >= 0]
    last = min(sampled) if sampled else 0
    out = []
    for v in stamped:
        last = v if v >= 0 else last
        out.append(last)
    return torch.as_tensor(out + [last] * (T - len(out)), dtype=torch.long)


def load_agent(spec: str):
    """rollout.agent -> the callable (ConfigError naming the key when it cannot be loaded)."""
    from reinforge.usercode import load_user_object

    return load_user_object(spec, "rollout.agent", expect="a function run(base_url, api_key, row)", accept=callable)


def make_gateway_rollout(r, inner, tokenizer) -> GatewayRollout:
    """The GatewayRollout of a RolloutConfig around a lean / hf / vllm rollout."""
    from reinforge.agents.parsers import get_parser

    return GatewayRollout(inner, tokenizer, load_agent(r.agent), parser=get_parser(r.tool_parser),
                          concurrency=r.agent_concurrency, timeout_s=r.agent_timeout_s, history=r.agent_history)
