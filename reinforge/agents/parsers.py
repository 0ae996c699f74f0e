"""Tool-call parsers (`rollout.tool_parser`): how calls are read from a turn's text, which
strings end a calling turn, and how tool results / environment answers become token ids.

    tag     <NAME>ARG</NAME>, the format of reinforge.agents.base for the character tokenizer:
            the turn stops right after `</NAME>`; each result is appended as
            tokenizer(format_tag_result(text)); an environment's answer as its plain text.
    hermes  <tool_call>{"name": ..., "arguments": {...}}</tool_call>, as Qwen2.5 / Hermes chat
            templates render calls with `tools=`; the turn ends at the template's end of turn
            (EOS, e.g. <|im_end|>) or right after `</tool_call>`. Results are rendered by the
            tokenizer's own chat template as `tool` messages (an environment's answer as a
            `user` message): the observation is the text the template puts between the end of
            the assistant's content and the next assistant header, less what the turn already
            generated of it (its EOS).

A malformed call (bad JSON, no name, an unclosed tag) is returned as a ToolCall with `error`
set: the executor answers it with an error result the policy reads, and it counts as a tool error.
"""
from __future__ import annotations

import json
import re

from reinforge.agents.base import Tool, ToolCall
from reinforge.tasks.tags import format_tag_result


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


class TagParser:
    name = "tag"

    def stop_strings(self, tools: dict[str, Tool]) -> list[str]:
        return [f"</{name}>" for name in tools]

    def parse(self, text: str, tools: dict[str, Tool]) -> list[ToolCall]:
        calls = []
        if not tools:
            return calls
        names = "|".join(re.escape(n) for n in sorted(tools, key=len, reverse=True))
        closed = re.compile(rf"<({names})>(.*?)</\1>", re.S)
        end = 0
        for m in closed.finditer(text):
            tool = tools[m.group(1)]
            args = {tool.first_param: m.group(2)} if tool.first_param else {}
            calls.append(ToolCall(m.group(1), args, raw=m.group(0)))
            end = m.end()
        opened = re.search(rf"<({names})>", text[end:])
        if opened:  # an opening tag the turn never closed (it ended at EOS or the budget)
            calls.append(ToolCall(opened.group(1), {}, raw=text[end + opened.start():],
                                  error=f"unclosed <{opened.group(1)}> (expected </{opened.group(1)}>)"))
        return calls

    def observation_ids(self, tokenizer, messages: list[dict], turn_text: str) -> list[int]:
        """messages: {"role": "tool" | "user", "content": str} appended after the turn;
        turn_text: the turn decoded with its special tokens (EOS) kept."""
        text = "".join(format_tag_result(m["content"]) if m["role"] == "tool" else m["content"] for m in messages)
        return _encode(tokenizer, text)


_HERMES_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)


class HermesParser:
    name = "hermes"

    def stop_strings(self, tools: dict[str, Tool]) -> list[str]:
        return ["</tool_call>"]

    def parse(self, text: str, tools: dict[str, Tool]) -> list[ToolCall]:
        calls = []
        for m in _HERMES_CALL.finditer(text):
            body, raw = m.group(1).strip(), m.group(0)
            if not m.group(2):
                calls.append(ToolCall("", {}, raw=raw, error="unclosed <tool_call> (expected </tool_call>)"))
                continue
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as exc:
                calls.append(ToolCall("", {}, raw=raw, error=f"tool call is not valid JSON ({exc.msg})"))
                continue
            name = obj.get("name") if isinstance(obj, dict) else None
            args = obj.get("arguments", {}) if isinstance(obj, dict) else None
            if isinstance(args, str):  # some templates and models write the arguments as a JSON string
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = None
            if not isinstance(name, str) or not isinstance(args, dict):
                calls.append(ToolCall(str(name or ""), {}, raw=raw,
                                      error='tool call must be {"name": <string>, "arguments": <object>}'))
                continue
            calls.append(ToolCall(name, args, raw=raw))
        return calls

    def observation_ids(self, tokenizer, messages: list[dict], turn_text: str) -> list[int]:
        sentinel = "\u2063REINFORGE_TURN\u2063"
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": sentinel}]
        before = tokenizer.apply_chat_template(base, tokenize=False)
        after = tokenizer.apply_chat_template(base + messages, tokenize=False, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template renders the conversation before the tool messages differently "
                             "once they are added; rollout.tool_parser=hermes needs a template that appends")
        closing = before[before.index(sentinel) + len(sentinel):]  # e.g. "<|im_end|>\n"
        # What of the assistant's closing the turn already generated (its EOS) is not repeated.
        done = max((k for k in range(len(closing) + 1) if turn_text.endswith(closing[:k])), default=0)
        return _encode(tokenizer, closing[done:] + after[len(before):])


PARSERS = {"tag": TagParser(), "hermes": HermesParser()}


def get_parser(name: str):
    """The parser registered as `name` (rollout.tool_parser)."""
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; parsers: {', '.join(PARSERS)}") from None
