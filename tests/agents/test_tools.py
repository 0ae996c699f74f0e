"""The calculator (safe arithmetic, bounded), the tool registry and user tools."""
from __future__ import annotations

import pytest

from reinforge.agents.base import Tool
from reinforge.agents.calculator import CalculatorError, calculate
from reinforge.agents.tools import TOOLS, load_tool, load_tools, python_tool, tool_from_function
from reinforge.config.load import ConfigError


@pytest.mark.parametrize("expr, value", [
    ("123*45", "5535"), ("2+3*4", "14"), ("(2+3)*4", "20"), ("-3+1", "-2"), ("10/4", "2.5"), ("10/2", "5"),
    ("7//2", "3"), ("7%3", "1"), ("2**10", "1024"), ("-(2**3)", "-8"), (" 1 + 1 ", "2"), ("1/3", "0.333333333333"),
    ("2**-1", "0.5"), ("1.5*2", "3"),
])
def test_calculator_values(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr, reason", [
    ("__import__('os')", "not allowed: Call"), ("x+1", "not allowed: Name"), ("'a'*3", "not allowed: Constant"),
    ("True+1", "not allowed: Constant"), ("1 if 1 else 2", "not allowed: IfExp"), ("1/0", "division by zero"),
    ("5%0", "division by zero"), ("9**9**9", "exponent"), ("99**99", "too large"), ("10**99*10**99", "too large"),
    ("1+", "cannot parse"), ("", "empty"), ("1" * 201, "longer than 200"), ("(-8)**0.5", "not a real number"),
    ("1e308*10", "too large"), ("[1,2]", "not allowed: List"), ("1<2", "not allowed: Compare"),
])
def test_calculator_refuses(expr, reason):
    with pytest.raises(CalculatorError, match=reason):
        calculate(expr)


def test_builtin_tools_have_openai_schemas():
    calc = TOOLS["calculator"].schema()
    assert calc["type"] == "function" and calc["function"]["name"] == "calculator"
    assert calc["function"]["parameters"]["required"] == ["expression"]
    assert TOOLS["calculator"].first_param == "expression" and TOOLS["python"].first_param == "code"
    assert TOOLS["calculator"].fn(expression="6*7") == "42"


def weather(city: str, days: int = 1, metric: bool = True) -> str:
    """The forecast for a city.

    Longer text that is not the description.

    Args:
        city: the city's name
        days (int): how many days ahead
    """
    return f"{city}: sunny for {days} day(s)"


def test_schema_from_function_signature_and_docstring():
    tool = tool_from_function(weather)
    assert tool.name == "weather" and tool.description == "The forecast for a city."
    assert tool.parameters == {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "the city's name"},
        "days": {"type": "integer", "description": "how many days ahead"},
        "metric": {"type": "boolean"}}}
    assert tool.fn(city="Oslo", days=2) == "Oslo: sunny for 2 day(s)"


def test_load_user_tools_from_file_and_module(tmp_path):
    f = tmp_path / "my_tools.py"
    f.write_text("from reinforge.agents.base import Tool\n"
                 "def echo(text: str) -> str:\n    '''Echo the text.'''\n    return text\n"
                 "shout = Tool('shout', 'Upper-case', {'type': 'object', 'properties': {'s': {'type': 'string'}}},"
                 " lambda s: s.upper())\n"
                 "NUMBER = 3\n")
    tools = load_tools([f"python:{f}:echo", f"python:{f}:shout", "calculator"])
    assert list(tools) == ["echo", "shout", "calculator"] and tools["shout"].fn(s="a") == "A"
    assert tools["echo"].parameters["required"] == ["text"]
    assert load_tool("python:tests.agents.test_tools:weather").name == "weather"
    assert load_tool(weather).name == "weather" and load_tool(TOOLS["python"]) is TOOLS["python"]
    for spec, message in [
        ("calculater", "unknown tool 'calculater'; did you mean 'calculator'"),
        (f"python:{f}:missing", "has no attribute 'missing'"),
        (f"python:{f}:NUMBER", "is a int; it must be"),
        (f"python:{tmp_path}/nope.py:f", "file not found"),
        ("python:no_such_module_xyz:f", "importing no_such_module_xyz raised ModuleNotFoundError"),
        ("python:justaname", "expected 'python:module:attr'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_tool(spec)
    with pytest.raises(ConfigError, match="two tools are named 'calculator'"):
        load_tools(["calculator", "calculator"])


def test_functions_that_cannot_be_described_are_refused():
    def undocumented(x: str) -> str:
        return x

    def star(*args) -> str:
        """Takes anything."""
        return ""

    with pytest.raises(ConfigError, match="needs a docstring"):
        tool_from_function(undocumented)
    with pytest.raises(ConfigError, match=r"\*args cannot be described"):
        tool_from_function(star)
    assert isinstance(load_tool("python"), Tool)


def test_python_tool_reports_output_and_errors():
    from reinforge.agents.tools import ToolFailure

    assert python_tool("print(6*7)") == "42\n"
    with pytest.raises(ToolFailure, match="ZeroDivisionError"):
        python_tool("print('before'); 1/0")


def test_docs_example_tool_and_environment_work(tmp_path):
    """docs/agents.md's user-defined tool and environment, loaded as the config names them; a
    tool that raises answers the policy with an error result instead of stopping the run."""
    import re
    from pathlib import Path

    from reinforge.agents.base import ToolCall
    from reinforge.agents.envs import load_env
    from reinforge.agents.executor import run_tool_calls

    doc = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    (tmp_path / "my_agents.py").write_text(re.search(r"```python\n(.*?)```", doc, re.S).group(1))
    tools = load_tools([f"python:{tmp_path}/my_agents.py:lookup", "calculator"])
    assert tools["lookup"].parameters["required"] == ["country"]
    results = run_tool_calls([ToolCall("lookup", {"country": "France"}), ToolCall("lookup", {"country": "Mars"}),
                              ToolCall("calculator", {"expression": "1/0"})], tools)
    assert results[0].text == "Paris" and not results[0].error
    assert results[1].error and results[1].text.startswith("error: KeyError") and "mars" in results[1].text
    assert results[2].error and "division by zero" in results[2].text
    env = load_env(f"python:{tmp_path}/my_agents.py:Echo")()
    assert env.reset({"ground_truth": "hi", "prompt": "", "data_source": "x"}) == "say hi: "  # the row the loop passes
    first, second = env.step("ho"), env.step("hi")
    assert (first.reward, first.done, second.reward, second.done) == (0.0, False, 1.0, True)
