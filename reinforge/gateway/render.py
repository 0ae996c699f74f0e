"""From an OpenAI chat request to the prompt ids the engine is fed, and back from sampled ids to
an OpenAI assistant message (pure functions over a tokenizer and an agents.parsers parser).

Rendering a request of a rollout:
- the messages are normalised (`normalize`): content parts joined, tool calls' JSON-string
  arguments read into objects (what chat templates render), fields OpenAI clients add and
  templates ignore dropped;
- if the messages continue a turn the gateway answered for this rollout (`Turn`: the earlier
  request's messages, then the assistant message it returned, as `match_turn` compares them),
  the prompt is that turn's prompt ids + its *sampled* ids + the ids of what the harness added
  after it, rendered as the run's tool parser renders observations in the agent loop
  (`parser.observation_ids`: the chat template's tool / user turns for hermes, `<r>...</r>` for
  tag). The earlier assistant turn is never re-rendered, so a BPE merge across its boundary or a
  template that would write the tool call differently cannot change the trained ids;
- otherwise (a first call, or a harness that edited its history) the chat template renders the
  whole conversation (`tools=` listed as the template lists them) and the text is encoded.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from reinforge.agents.base import Tool, ToolCall


class RequestError(ValueError):
    """A request the gateway cannot serve: answered with an OpenAI-style 400 error body."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _content(value, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: only text is served
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}: only text content parts are supported", where)
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where}: content must be a string or a list of text parts", where)


def _arguments(value, where: str) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            obj = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            raise RequestError(f"{where}: arguments is not valid JSON", where) from None
        if isinstance(obj, dict):
            return obj
    raise RequestError(f"{where}: arguments must be a JSON object", where)


def normalize(messages) -> list[dict]:
    """OpenAI chat messages -> [{"role", "content"} (+ "tool_calls": [{"name", "arguments"}],
    + "name" / "tool_call_id")]: what the templates and parsers read and what turns compare."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(f"{where}: a message needs a role of system, user, assistant or tool", where)
        msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": _content(m.get("content"), where)}
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                f = c.get("function") if isinstance(c, dict) else None
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise RequestError(f"{where}.tool_calls[{j}]: needs function.name", where)
                calls.append({"name": f["name"], "arguments": _arguments(f.get("arguments"), f"{where}.tool_calls[{j}]")})
            msg["tool_calls"] = calls
        for key in ("name", "tool_call_id"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def request_tools(tools) -> list[Tool]:
    """OpenAI `tools` ([{"type": "function", "function": {name, description, parameters}}]) ->
    Tools without a function (what the parsers read: names and the first parameter)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise RequestError(f"tools[{i}]: needs type 'function' and function.name", "tools")
        params = f.get("parameters") or {"type": "object", "properties": {}}
        out.append(Tool(f["name"], str(f.get("description", "")), params, fn=None))
    return out


def template_messages(messages: list[dict]) -> list[dict]:
    """Normalised messages as the chat templates take them (tool calls under `function`)."""
    out = []
    for m in messages:
        t = {k: v for k, v in m.items() if k != "tool_calls"}
        if m.get("tool_calls"):
            t["tool_calls"] = [{"type": "function", "function": c} for c in m["tool_calls"]]
        out.append(t)
    return out


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def render_fresh(tokenizer, messages: list[dict], tools: list[Tool]) -> list[int]:
    """The chat template's rendering of the whole conversation (generation prompt added), encoded."""
    kw = {"tools": [t.schema() for t in tools]} if tools else {}
    text = tokenizer.apply_chat_template(template_messages(messages), add_generation_prompt=True, tokenize=False, **kw)
    return encode(tokenizer, text)


@dataclass(frozen=True)
class Turn:
    """An answered call of a rollout, as later requests may continue it."""

    messages: list[dict]
    """The request's normalised messages."""
    assistant: dict
    """The normalised assistant message returned (one per choice: one Turn per choice)."""
    full_ids: tuple[int, ...]
    """Its prompt ids + sampled ids."""
    turn_text: str
    """The sampled ids decoded with special tokens kept (what observation_ids reads)."""


def same_assistant(sent: dict, returned: dict) -> bool:
    """Whether the assistant message a request holds is the one the gateway returned: same text
    and the same calls (names and arguments as objects; ids and formatting ignored)."""
    if sent.get("role") != "assistant" or sent.get("content", "") != returned.get("content", ""):
        return False
    return [(c["name"], c["arguments"]) for c in sent.get("tool_calls", [])] == \
        [(c["name"], c["arguments"]) for c in returned.get("tool_calls", [])]


def match_turn(messages: list[dict], turns: list[Turn]) -> Turn | None:
    """The latest turn the request continues: its messages, then its assistant message, lead
    the request's (None: a first call or an edited history)."""
    for t in reversed(turns):
        k = len(t.messages)
        if len(messages) > k and messages[:k] == t.messages and same_assistant(messages[k], t.assistant):
            return t
    return None


def prompt_ids(tokenizer, parser, messages: list[dict], tools: list[Tool], turns: list[Turn]) -> tuple[list[int], bool]:
    """The ids to feed the engine for a request (module doc) -> (ids, whether it continues a turn)."""
    t = match_turn(messages, turns)
    if t is None:
        return render_fresh(tokenizer, messages, tools), False
    rest = [{"role": m["role"], "content": m["content"], **({"name": m["name"]} if "name" in m else {})}
            for m in messages[len(t.messages) + 1:]]
    return list(t.full_ids) + parser.observation_ids(tokenizer, rest, t.turn_text), True


def assistant_message(tokenizer, parser, sampled: list[int], tools: list[Tool]) -> tuple[dict, list[ToolCall]]:
    """Sampled ids -> (normalised assistant message, parsed calls). With tools, calls are parsed
    by the run's parser from the text with special tokens kept; the content is the text left
    outside the calls, special tokens dropped (returned text only: nothing trained reads it). Malformed calls stay in the content and are not returned."""
    text = tokenizer.decode(sampled, skip_special_tokens=True)
    if not tools:
        return {"role": "assistant", "content": text}, []
    raw = tokenizer.decode(sampled, skip_special_tokens=False)
    by_name = {t.name: t for t in tools}
    calls = [c for c in parser.parse(raw, by_name) if not c.error and c.name in by_name]
    if not calls:
        return {"role": "assistant", "content": text}, []
    content = raw
    for c in calls:
        content = content.replace(c.raw, "")
    content = tokenizer.decode(encode(tokenizer, content), skip_special_tokens=True)  # EOS out (text only)
    return {"role": "assistant", "content": content.strip(),
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}, calls


def number(body: dict, key: str, default, lo, hi, kind=float):
    """A request's numeric field (`default` when absent or null), checked: a RequestError naming
    the key when it is not a number of that kind or lies outside [lo, hi]."""
    v = body.get(key, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise RequestError(f"{key} must be a number", key)
    if not lo <= v <= hi:
        raise RequestError(f"{key}={v} is out of range [{lo}, {hi}]", key)
    return kind(v)
