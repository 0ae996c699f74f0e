"""Safe arithmetic for the `calculator` tool: reinforge.safe_eval's evaluator with its default
grammar (int and float literals, + - * / // % **, unary + and -, parentheses; names, calls,
attributes, comparisons, strings and everything else refused; length, magnitude and exponent
bounded), the value formatted as text.
"""
from __future__ import annotations

from reinforge.safe_eval import ExpressionError, Grammar, evaluate

CalculatorError = ExpressionError  # what the tool raises; its message is shown to the policy
GRAMMAR = Grammar()


def format_number(value: int | float) -> str:
    """An int as is; a float with up to 12 significant digits, without a trailing '.0' when it is
    a whole number (10/2 -> '5')."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else format(value, ".12g")


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text, e.g. calculate("123*45") == "5535".

    CalculatorError (a ValueError) with a one-line reason for anything else.
    """
    return format_number(evaluate(expression, GRAMMAR).value)
