"""Safe arithmetic for the `calculator` tool: the expression is parsed with `ast` and walked;
nothing is ever passed to eval.

Allowed: int and float literals, + - * / // % **, unary + and -, parentheses. Names, calls,
attributes, comparisons, strings and everything else are refused. Sizes are bounded so that no
input can stall a worker: the expression's length, every intermediate result's magnitude, and
the exponent of ** (checked before the power is computed).
"""
from __future__ import annotations

import ast
import math
import operator
import warnings

MAX_EXPR_CHARS = 200
# |value| of any intermediate result; 1e100 keeps big-int arithmetic microseconds-cheap.
MAX_MAGNITUDE = 10**100
MAX_EXPONENT = 100

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is shown to the policy."""


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent} is too large (at most {MAX_EXPONENT})")
    # log10 of the result bounds its size before it is computed (9**99 would be fine, 99**99 is not).
    if base != 0 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise CalculatorError("result too large")


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # bool is refused
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
        if isinstance(value, complex):  # (-8) ** 0.5
            raise CalculatorError("the result is not a real number")
        if abs(value) > MAX_MAGNITUDE or (isinstance(value, float) and not math.isfinite(value)):
            raise CalculatorError("result too large")
        return value
    raise CalculatorError(f"not allowed: {type(node).__name__} (only numbers, + - * / // % ** and parentheses)")


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
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("empty expression")
    if len(expression) > MAX_EXPR_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        with warnings.catch_warnings():  # "12x" warns "invalid decimal literal" before failing
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression.strip()!r}") from None
    return format_number(_eval(tree))
