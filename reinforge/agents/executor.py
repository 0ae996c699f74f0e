"""Run the tool calls of one turn (of every episode in the batch) concurrently, never raising.

Each call runs in its own daemon thread and is waited for until its tool's `timeout_s` from the
start of the batch: a call still running then is abandoned (a thread cannot be killed; a daemon
thread at least never blocks interpreter exit, which a ThreadPoolExecutor's workers would) and
answered with an error. Tools that must be killable (the python sandbox) bound their own work
in a subprocess. Unknown tools, arguments that do not fit the tool's JSON schema, malformed
calls (ToolCall.error) and exceptions become error results with one short line for the policy.
"""
from __future__ import annotations

import threading
import time

from reinforge.agents.base import Tool, ToolCall, ToolResult

MAX_ERROR_CHARS = 200


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


def argument_error(tool: Tool, arguments: dict) -> str | None:
    """Why `arguments` do not fit the tool's schema (missing required or unknown names), or None."""
    props = tool.parameters.get("properties", {})
    missing = [p for p in tool.parameters.get("required", []) if p not in arguments]
    unknown = [a for a in arguments if props and a not in props]
    if missing:
        return f"{tool.name}: missing argument {', '.join(map(repr, missing))}"
    if unknown and tool.parameters.get("additionalProperties", False) is False:
        return f"{tool.name}: unknown argument {', '.join(map(repr, unknown))} (takes {', '.join(props)})"
    return None


def _precheck(call: ToolCall, tools: dict[str, Tool]) -> str | None:
    if call.error:
        return f"malformed tool call: {call.error}"
    if call.name not in tools:
        return f"unknown tool {call.name!r}; tools: {', '.join(tools) or 'none'}"
    return argument_error(tools[call.name], call.arguments)


def run_tool_calls(calls: list[ToolCall], tools: dict[str, Tool] | list[dict[str, Tool]]) -> list[ToolResult]:
    """One ToolResult per call, in order; all valid calls run at once. `tools`: the tools every
    call may use, or one such dict per call (episodes of one batch may have different tools).
    An exception's text is `Type: message`, a ToolFailure's its message alone (the tool's words)."""
    from reinforge.agents.tools import ToolFailure

    per_call = tools if isinstance(tools, list) else [tools] * len(calls)
    results: list[ToolResult | None] = [None] * len(calls)
    threads: list[tuple[int, threading.Thread, dict]] = []
    start = time.monotonic()
    for i, call in enumerate(calls):
        why = _precheck(call, per_call[i])
        if why:
            results[i] = ToolResult(f"error: {_short(why)}", error=True)
            continue
        box: dict = {}

        def target(fn=per_call[i][call.name].fn, args=call.arguments, box=box):
            t0 = time.monotonic()
            try:
                box["value"] = fn(**args)
            except BaseException as exc:  # noqa: BLE001 - any failure goes back to the policy as text
                box["error"] = str(exc) if isinstance(exc, ToolFailure) else f"{type(exc).__name__}: {exc}"
            box["latency"] = time.monotonic() - t0

        thread = threading.Thread(target=target, name=f"tool-{call.name}", daemon=True)
        thread.start()
        threads.append((i, thread, box))
    for i, thread, box in threads:
        tool = per_call[i][calls[i].name]
        thread.join(max(0.0, start + tool.timeout_s - time.monotonic()))
        if thread.is_alive():
            results[i] = ToolResult(f"error: {tool.name} timed out after {tool.timeout_s:g}s", error=True,
                                    latency_s=time.monotonic() - start)
        elif "error" in box:
            results[i] = ToolResult(f"error: {_short(box['error'])}", error=True, latency_s=box["latency"])
        else:
            value = box["value"]
            results[i] = ToolResult(value if isinstance(value, str) else str(value), latency_s=box["latency"])
    return results
