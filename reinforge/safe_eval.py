"""Safe arithmetic: an expression is parsed with `ast` and walked; nothing is ever passed to eval.

The one evaluator behind the `calculator` tool (agents/calculator.py) and the `countdown`
verifier (tasks/countdown.py). A `Grammar` says what an expression may hold (operators, float
literals, a character whitelist, exact fractions) and how big it may get. Every input is
bounded so that none can stall a worker: the text's length, the parse and walk depth, every
intermediate result's magnitude, and the exponent of ** (checked before the power is computed).
Anything else raises ExpressionError (a ValueError) with a one-line reason.

A leaf module (imports nothing of reinforge), so both tasks/ and agents/ import it downward.
"""
from __future__ import annotations

import ast
import math
import operator
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

_BINARY = {"+": (ast.Add, operator.add), "-": (ast.Sub, operator.sub), "*": (ast.Mult, operator.mul),
           "/": (ast.Div, operator.truediv), "//": (ast.FloorDiv, operator.floordiv),
           "%": (ast.Mod, operator.mod), "**": (ast.Pow, operator.pow)}
_UNARY = {"-": (ast.USub, operator.neg), "+": (ast.UAdd, operator.pos)}


class ExpressionError(ValueError):
    """An expression refused or not computable; the message is one line (the calculator shows it
    to the policy)."""


@dataclass(frozen=True)
class Grammar:
    """What an expression may contain, and its bounds."""

    binary: tuple[str, ...] = ("+", "-", "*", "/", "//", "%", "**")
    """Binary operators allowed, by symbol (in the order the refusal message lists them)."""
    unary: tuple[str, ...] = ("-", "+")
    """Unary operators allowed."""
    floats: bool = True
    """Float literals allowed (ints always are; bools never)."""
    exact: bool = False
    """Compute with fractions.Fraction, so 7/2 is exactly 7/2."""
    chars: frozenset | None = None
    """When set, the only characters the text may hold (checked before parsing)."""
    max_chars: int = 200
    """The text's length limit."""
    max_magnitude: int = 10**100
    """|value| of any intermediate result; 1e100 keeps big-int arithmetic microseconds-cheap."""
    max_exponent: int = 100
    """|exponent| of **."""


class Evaluation(NamedTuple):
    value: int | float | Fraction
    """The expression's value."""
    literals: list
    """The number literals the expression holds, in reading order."""


def evaluate(text: str, grammar: Grammar = Grammar()) -> Evaluation:
    """The value of the arithmetic expression `text` and its literals; ExpressionError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("empty expression")
    if len(text) > grammar.max_chars:
        raise ExpressionError(f"expression longer than {grammar.max_chars} characters")
    if grammar.chars is not None and not set(text) <= grammar.chars:
        raise ExpressionError(f"only the characters {''.join(sorted(grammar.chars))!r} are allowed")
    try:
        with warnings.catch_warnings():  # "12x" warns "invalid decimal literal" before failing
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ExpressionError(f"cannot parse {text.strip()!r}") from None
    literals: list = []
    try:
        return Evaluation(_Walker(grammar, literals).eval(tree.body), literals)
    except RecursionError:
        raise ExpressionError("expression nested too deeply") from None


class _Walker:
    """Evaluates the allowed nodes of one parsed expression, recording its literals."""

    def __init__(self, grammar: Grammar, literals: list):
        self.g, self.literals = grammar, literals
        self.binary = {_BINARY[s][0]: _BINARY[s][1] for s in grammar.binary}
        self.unary = {_UNARY[s][0]: _UNARY[s][1] for s in grammar.unary}
        self.numbers = (int, float) if grammar.floats else (int,)

    def eval(self, node: ast.AST):
        if isinstance(node, ast.Constant) and type(node.value) in self.numbers:  # bool is refused
            self.literals.append(node.value)
            return Fraction(node.value) if self.g.exact else node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in self.unary:
            return self.unary[type(node.op)](self.eval(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in self.binary:
            left, right = self.eval(node.left), self.eval(node.right)
            if isinstance(node.op, ast.Pow):
                self.check_power(left, right)
            try:
                value = self.binary[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ExpressionError("division by zero") from None
            except OverflowError:
                raise ExpressionError("result too large") from None
            if isinstance(value, complex):  # (-8) ** 0.5
                raise ExpressionError("the result is not a real number")
            if abs(value) > self.g.max_magnitude or (isinstance(value, float) and not math.isfinite(value)):
                raise ExpressionError("result too large")
            return value
        raise ExpressionError(f"not allowed: {type(node).__name__} "
                              f"(only numbers, {' '.join(self.g.binary)} and parentheses)")

    def check_power(self, base, exponent) -> None:
        if abs(exponent) > self.g.max_exponent:
            raise ExpressionError(f"exponent {exponent} is too large (at most {self.g.max_exponent})")
        # log10 of the result bounds its size before it is computed (9**99 would be fine, 99**99 is not).
        if base != 0 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(self.g.max_magnitude):
            raise ExpressionError("result too large")
