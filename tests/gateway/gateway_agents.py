"""Agents for the gateway tests: ordinary OpenAI-client code, importable as rollout.agent
(`tests/gateway/gateway_agents.py:NAME`)."""
from __future__ import annotations

import asyncio
import itertools
import json
import time

import openai

REV = {"type": "function", "function": {"name": "rev", "description": "Reverse a string.",
                                        "parameters": {"type": "object", "properties": {"s": {"type": "string"}},
                                                       "required": ["s"]}}}


_CLIENT = openai.OpenAI(api_key="per-run", max_retries=0)  # one connection pool; a new client costs ~0.1 s


def _client(base_url, api_key):
    return _CLIENT.with_options(base_url=base_url, api_key=api_key)


def _messages(row) -> list:
    p = row["prompt"]
    return [{"role": "user", "content": p}] if isinstance(p, str) else list(p)


def digits(base_url, api_key, row):
    """One call; the reward is the fraction of digits in the answer (and a metric)."""
    client = _client(base_url, api_key)
    r = client.chat.completions.create(model="policy", messages=_messages(row), max_tokens=6)
    text = r.choices[0].message.content or ""
    frac = sum(c.isdigit() for c in text) / max(len(text), 1)
    return {"reward": frac, "metrics": {"answer_chars": len(text)}}


async def async_digits(base_url, api_key, row):
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        r = await client.chat.completions.create(model="policy", messages=_messages(row), max_tokens=6)
    text = r.choices[0].message.content or ""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def two_turns(base_url, api_key, row):
    """Two calls, the second continuing the first after a user turn the harness writes."""
    client = _client(base_url, api_key)
    msgs = _messages(row)
    r = client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    msgs += [r.choices[0].message, {"role": "user", "content": "+1="}]
    client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    return 1.0


def edits_history(base_url, api_key, row):
    """The second call rewrites the first answer: an edited history (two sequences)."""
    client = _client(base_url, api_key)
    msgs = _messages(row)
    client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    msgs += [{"role": "assistant", "content": "99"}, {"role": "user", "content": "+1="}]
    client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    return 0.5


def rev_tool(base_url, api_key, row):
    """The `rev` task of tests/agents as an OpenAI tools= loop: call, run the tool, answer."""
    client = _client(base_url, api_key)
    msgs = _messages(row)
    for _ in range(3):
        m = client.chat.completions.create(model="policy", messages=msgs, tools=[REV], temperature=1.0).choices[0].message
        msgs.append(m)
        if not m.tool_calls:
            return float((m.content or "").strip() == str(row["ground_truth"]))
        for c in m.tool_calls:
            msgs.append({"role": "tool", "tool_call_id": c.id, "content": json.loads(c.function.arguments)["s"][::-1]})
    return 0.0


def hangs(base_url, api_key, row):
    if row["ground_truth"] == "0":
        time.sleep(3600)
    return digits(base_url, api_key, row)


def raises(base_url, api_key, row):
    if row["ground_truth"] == "0":
        raise RuntimeError("agent bug")
    return digits(base_url, api_key, row)


def never_calls(base_url, api_key, row):
    return 1.0


def bad_return(base_url, api_key, row):
    digits(base_url, api_key, row)
    return "great"


async def slow_async(base_url, api_key, row):
    await asyncio.sleep(3600)


def versioned(base_url, api_key, row):
    """digits, with the weight version the gateway stamped on the answer as a metric."""
    client = _client(base_url, api_key)
    r = client.chat.completions.create(model="policy", messages=_messages(row), max_tokens=6)
    text = r.choices[0].message.content or ""
    return {"reward": sum(c.isdigit() for c in text) / max(len(text), 1),
            "metrics": {"weight_version": float(r.model_extra["weight_version"])}}


def two_turns_versioned(base_url, api_key, row):
    """two_turns, with the weight versions of its two answers as metrics (they are equal)."""
    client = _client(base_url, api_key)
    msgs = _messages(row)
    r = client.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
    msgs += [r.choices[0].message, {"role": "user", "content": "+1="}]
    r2 = client.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
    return {"reward": float(any(c.isdigit() for c in r2.choices[0].message.content or "")),
            "metrics": {"weight_version": float(r.model_extra["weight_version"]),
                        "version_changed": float(r2.model_extra["weight_version"] != r.model_extra["weight_version"])}}


def hangs_on_even(base_url, api_key, row):
    """Hangs when the answer is even, else digits."""
    if int(row["ground_truth"]) % 2 == 0:
        time.sleep(3600)
    return digits(base_url, api_key, row)


_RUNS = itertools.count()


def hangs_after_four(base_url, api_key, row):
    """digits for the first four runs of this process's import, then hangs."""
    if next(_RUNS) >= 4:
        time.sleep(3600)
    return digits(base_url, api_key, row)


def mixed(base_url, api_key, row):
    """By the prompt (so every run of a group alike): an edited history (two sequences), a raise
    (a dropped run), or one call."""
    kind = mixed_kind(row["prompt"])
    if kind == 0:
        return edits_history(base_url, api_key, row)
    if kind == 1:
        raise RuntimeError("agent bug")
    return digits(base_url, api_key, row)


def mixed_then_hangs(base_url, api_key, row):
    """`mixed` in its gateway's first round (rollout ids g1-...), then hangs: what only the
    producer's stop (an interrupt) ends before the deadline."""
    if "/rollouts/g1-" not in base_url:
        time.sleep(3600)
    return mixed(base_url, api_key, row)


def mixed_kind(prompt) -> int:
    return sum(map(ord, json.dumps(prompt))) % 3
