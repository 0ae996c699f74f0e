"""`stream: true`: an answer of the gateway (server.py) as OpenAI's server-sent event chunks.

The gateway streams an answer once it is whole (the engine samples a request's tokens in one
call, batched with other requests): per choice, one chunk with the whole text (chat: `delta`
with role, content and tool_calls; completions: `text`) and its log-probs, then one with its
`finish_reason`; with stream_options.include_usage a last chunk with no choices and the usage.
The wire format is OpenAI's, what the openai client's `stream=True` parses: `data: {json}` lines,
then `data: [DONE]`. The extras of a plain answer ride along: `prompt_token_ids` and
`weight_version` on each chunk, each choice's `token_ids` on its first chunk.
"""
from __future__ import annotations

import json


def stream_chunks(answer: dict, chat: bool, include_usage: bool) -> list[dict]:
    """A whole answer (server.Gateway._answer's body) -> its chunks, in sending order."""
    base = {"id": answer["id"], "object": "chat.completion.chunk" if chat else "text_completion",
            "created": answer["created"], "model": answer["model"],
            "prompt_token_ids": answer["prompt_token_ids"], "weight_version": answer["weight_version"]}
    out = []
    for c in answer["choices"]:
        first = {"index": c["index"], "logprobs": c["logprobs"], "finish_reason": None, "token_ids": c["token_ids"]}
        last = {"index": c["index"], "logprobs": None, "finish_reason": c["finish_reason"]}
        if chat:
            m = c["message"]
            delta = {"role": "assistant", "content": m["content"]}
            if m.get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(m["tool_calls"])]
            first["delta"], last["delta"] = delta, {}
        else:
            first["text"], last["text"] = c["text"], ""
        out += [{**base, "choices": [first]}, {**base, "choices": [last]}]
    if include_usage:
        out.append({**base, "choices": [], "usage": answer["usage"]})
    return out


def sse_lines(chunks: list[dict]) -> bytes:
    """The event-stream body: one `data:` event per chunk, then `data: [DONE]`."""
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


async def send_stream(request, answer: dict, chat: bool, include_usage: bool):
    """The aiohttp response streaming `answer` (a client gone mid-stream ends it quietly: the
    call was recorded when the answer was built)."""
    from aiohttp import web

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    try:
        await resp.write(sse_lines(stream_chunks(answer, chat, include_usage)))
        await resp.write_eof()
    except ConnectionError:
        pass
    return resp
