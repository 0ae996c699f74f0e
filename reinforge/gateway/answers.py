"""The parts of an OpenAI answer body the gateway writes from sampled ids (pure functions):
the text without a request's stop string, the assistant message with OpenAI's tool_calls, and
the `logprobs` block of a chat or a text completion (server.Gateway._answer assembles them)."""
from __future__ import annotations

import json
import uuid


def strip_stop(text: str, stops: list[str]) -> str:
    """OpenAI leaves a request's stop string out of the text (the captured ids keep it)."""
    for s in stops:
        if s in text:
            text = text[:text.index(s)]
    return text


def openai_message(msg: dict, user_stops: list[str]) -> dict:
    """render.assistant_message's {content, tool_calls: [{name, arguments}]} -> OpenAI's message
    (content None beside calls; each call an id and its arguments as a JSON string)."""
    out = {"role": "assistant", "content": strip_stop(msg["content"], user_stops)}
    if msg.get("tool_calls"):
        out["content"] = out["content"] or None
        out["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                              "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                             for c in msg["tool_calls"]]
    return out


def logprobs_body(tok, ids: list[int], logp: list[float], chat: bool) -> dict:
    """The sampled tokens' log-probs as /v1/chat/completions (`content` entries) or
    /v1/completions (`tokens`, `token_logprobs`, `text_offset`) writes them; no top_logprobs."""
    tokens = [tok.decode([t], skip_special_tokens=False) for t in ids]
    if chat:
        return {"content": [{"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")), "top_logprobs": []}
                            for s, lp in zip(tokens, logp)], "refusal": None}
    offsets, pos = [], 0
    for s in tokens:
        offsets.append(pos)
        pos += len(s)
    return {"tokens": tokens, "token_logprobs": logp, "top_logprobs": None, "text_offset": offsets}
