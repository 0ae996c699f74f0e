"""run_tool_calls: concurrent, per-call timeouts, never raises, results in call order."""
from __future__ import annotations

import time

from reinforge.agents.base import Tool, ToolCall
from reinforge.agents.executor import run_tool_calls
from reinforge.agents.tools import ToolFailure

SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}


def _sleepy(x: str) -> str:
    time.sleep(float(x))
    return f"slept {x}"


def _boom(x: str) -> str:
    raise RuntimeError("kaput " + "z" * 500)


def _refuse(x: str) -> str:
    raise ToolFailure("no such page")


TOOLS = {"sleep": Tool("sleep", "sleeps", SCHEMA, _sleepy, timeout_s=1.0),
         "refuse": Tool("refuse", "fails in its own words", SCHEMA, _refuse),
         "boom": Tool("boom", "raises", SCHEMA, _boom),
         "num": Tool("num", "returns a number", SCHEMA, lambda x: 42)}


def test_calls_run_concurrently_and_keep_their_order():
    t0 = time.monotonic()
    out = run_tool_calls([ToolCall("sleep", {"x": "0.4"}), ToolCall("sleep", {"x": "0.4"}),
                          ToolCall("sleep", {"x": "0.4"})], TOOLS)
    elapsed = time.monotonic() - t0
    assert [r.text for r in out] == ["slept 0.4"] * 3 and not any(r.error for r in out)
    # one after the other they take 1.2 s; the 0.4 s margin absorbs a loaded machine's scheduling
    assert elapsed < 0.8 + 0.4, f"three 0.4 s calls took {elapsed:.2f} s: not concurrent"
    assert all(0.35 < r.latency_s < 1.0 for r in out)


def test_every_failure_is_an_error_result():
    calls = [ToolCall("sleep", {"x": "5"}), ToolCall("boom", {"x": ""}), ToolCall("nope", {"x": ""}),
             ToolCall("sleep", {}), ToolCall("sleep", {"x": "0", "y": 1}), ToolCall("", {}, error="bad JSON"),
             ToolCall("num", {"x": ""})]
    t0 = time.monotonic()
    out = run_tool_calls(calls, TOOLS)
    assert time.monotonic() - t0 < 2.0  # the 5 s call is abandoned at its 1.0 s timeout
    assert [r.error for r in out] == [True] * 6 + [False]
    assert out[0].text == "error: sleep timed out after 1s"
    assert out[1].text.startswith("error: RuntimeError: kaput z") and len(out[1].text) < 220
    assert "unknown tool 'nope'" in out[2].text and "tools: sleep, refuse, boom, num" in out[2].text
    assert "missing argument 'x'" in out[3].text
    assert "unknown argument 'y'" in out[4].text
    assert out[5].text == "error: malformed tool call: bad JSON"
    assert out[6].text == "42"  # a non-string result is shown as its str()
    assert run_tool_calls([ToolCall("refuse", {"x": ""})], TOOLS)[0].text == "error: no such page"


def test_per_call_tool_sets():
    """Episodes of one batch may have different tools: each call is checked against its own."""
    out = run_tool_calls([ToolCall("num", {"x": ""}), ToolCall("num", {"x": ""})], [TOOLS, {}])
    assert [r.error for r in out] == [False, True]
