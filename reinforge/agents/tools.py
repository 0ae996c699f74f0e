"""The tool registry and user tools (reinforge.agents.executor calls them, never crashing the run).

    TOOLS["calculator"]              # safe arithmetic (reinforge.agents.calculator)
    TOOLS["python"]                  # a script in the sandbox (reinforge.sandbox)
    load_tool("my_tools.py:weather")   # a Tool, or a function with a docstring

A user tool is named `path/to/file.py:attr` or `package.module:attr` (reinforge.usercode, the
syntax of reward functions too; the old `python:` prefix still loads, with a deprecation line). A function
becomes a Tool whose JSON schema is read from its signature: parameters with type hints str, int,
float, bool, list or dict (others: string), those without a default required; its description is
the docstring's first paragraph, and an `Args:` section's `name: text` lines describe parameters.
"""
from __future__ import annotations

import inspect
from typing import Callable, get_type_hints

from reinforge.agents.base import Tool
from reinforge.agents.calculator import calculate
from reinforge.sandbox import run_python
from reinforge.config.hints import did_you_mean
from reinforge.config.load import ConfigError
from reinforge.usercode import load_user_object
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolFailure(Exception):
    """Raised by a tool to report a failure the policy should read (the message is its text)."""


def python_tool(code: str) -> str:
    """Run Python code in a sandbox (5 s, 512 MiB, no network) and return what it printed.

    Args:
        code: a Python script; print the values you need.
    """
    done = run_python(code, timeout_s=5.0, memory_mb=512, max_output_chars=2000)
    if done.timed_out:
        raise ToolFailure("timed out after 5 s" + (f"; output so far: {done.stdout}" if done.stdout else ""))
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise ToolFailure((done.stdout + last[0]).strip())
    return done.stdout


TOOLS: dict[str, Tool] = {
    "calculator": Tool(
        name="calculator",
        description="Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
        parameters={"type": "object", "required": ["expression"],
                    "properties": {"expression": {"type": "string", "description": "e.g. 123*45"}}},
        fn=calculate, timeout_s=2.0),
    "python": Tool(
        name="python",
        description="Run a Python script in a sandbox (no network, 5 s, 512 MiB) and return what it printed.",
        parameters={"type": "object", "required": ["code"],
                    "properties": {"code": {"type": "string", "description": "a Python script; print the result"}}},
        fn=python_tool, timeout_s=10.0),
}


def _param_docs(doc: str) -> dict[str, str]:
    """`name: text` lines of a docstring's Args: section (Google style; `name (type): text` too)."""
    out, in_args = {}, False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
        elif in_args and ":" in stripped:
            name, text = stripped.split(":", 1)
            out[name.split("(")[0].strip()] = text.strip()
        elif in_args and not stripped:
            in_args = False
    return out


def tool_from_function(fn: Callable, name: str | None = None, timeout_s: float = 10.0) -> Tool:
    """A Tool for `fn(**arguments) -> str`, its JSON schema read from the signature (module doc).

    ConfigError when `fn` has no docstring (the policy's description) or takes *args/**kwargs.
    """
    name = name or fn.__name__
    doc = inspect.getdoc(fn)
    if not doc:
        raise ConfigError(f"tool '{name}': the function needs a docstring (it is the tool's description)")
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to strings
        hints = {}
    props, required = {}, []
    described = _param_docs(doc)
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"tool '{name}': *{p.name} cannot be described in a JSON schema; "
                              "name every parameter")
        prop = {"type": _JSON_TYPES.get(hints.get(p.name), "string")}
        if p.name in described:
            prop["description"] = described[p.name]
        props[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    return Tool(name=name, description=description, fn=fn, timeout_s=timeout_s,
                parameters={"type": "object", "properties": props, "required": required})


def load_tool(spec: str | Tool | Callable) -> Tool:
    """A Tool from a built-in name (TOOLS), a user-code spec (`file.py:attr`, `module:attr`), a Tool,
    or a documented function."""
    if isinstance(spec, Tool):
        return spec
    if callable(spec):
        return tool_from_function(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"tool spec must be a name or 'module:attr', got {spec!r}")
    if spec in TOOLS:
        return TOOLS[spec]
    if ":" not in spec:
        raise ConfigError(f"unknown tool '{spec}'; {did_you_mean(spec, TOOLS)}built-ins: {', '.join(sorted(TOOLS))}; "
                          "or 'package.module:attr' / 'path/to/file.py:attr' for your own")
    obj = load_user_object(spec, "tool", expect="a reinforge.agents.base.Tool or a function",
                           accept=lambda o: isinstance(o, Tool) or callable(o))
    return obj if isinstance(obj, Tool) else tool_from_function(obj)


def load_tools(specs) -> dict[str, Tool]:
    """{name: Tool} for a list of specs; ConfigError on two tools with one name."""
    out: dict[str, Tool] = {}
    for spec in specs or []:
        tool = load_tool(spec)
        if tool.name in out:
            raise ConfigError(f"two tools are named '{tool.name}'; tool names must be unique")
        out[tool.name] = tool
    return out
