"""The tag format of tool calls and results for the built-in character tokenizer (the `tag`
parser of reinforge.agents.parsers): a call is `<NAME>ARG</NAME>`, NAME a registered tool and ARG
the string value of the tool's first parameter; the turn stops right after `</NAME>`, and the
observation appended is `format_tag_result(text)`. The agent tasks' SFT demonstrations
(calculator, guess_number) use the same functions, so that what SFT teaches is exactly what the
loop produces. Here, below agents/, so that tasks/ imports it downward.
"""
from __future__ import annotations

TAG_RESULT_OPEN, TAG_RESULT_CLOSE = "<r>", "</r>"


def format_tag_call(name: str, arg: str) -> str:
    """The tag-format text of a call, e.g. `<calculator>123*45</calculator>`."""
    return f"<{name}>{arg}</{name}>"


def format_tag_result(text: str) -> str:
    """The observation appended after a tag-format call, e.g. `<r>5535</r>`."""
    return f"{TAG_RESULT_OPEN}{text}{TAG_RESULT_CLOSE}"
