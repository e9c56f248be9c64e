"""A calculator tool: arithmetic on numbers, evaluated by walking the expression's syntax tree.

Allowed: int and float literals, + - * / // % **, unary + and -, parentheses. Nothing else parses into
a value (names, calls, attributes, subscripts, comparisons, strings are refused), and Python's `eval` is
never called. Limits keep a call cheap: the expression's length, the size of exponents and of the numbers
a step produces (so 9**9**9 or 10**10**6 is refused, not computed).
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable, Union

from .base import BaseTool

Number = Union[int, float]

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_INT_DIGITS = 60  # bigger integer results are refused (they also make exponent chains blow up)

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not allowed arithmetic or breaks a limit; the message is shown to the model."""


def evaluate(expression: str, max_chars: int = MAX_EXPRESSION_CHARS, max_exponent: int = MAX_EXPONENT) -> Number:
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("expression must be a non-empty string")
    if len(expression) > max_chars:
        raise CalculatorError(f"expression is {len(expression)} characters; the limit is {max_chars}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not an arithmetic expression ({e.msg})") from None
    return _eval(tree.body, max_exponent)


def _eval(node: ast.AST, max_exponent: int) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand, max_exponent)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, max_exponent), _eval(node.right, max_exponent)
        if isinstance(node.op, ast.Pow) and abs(right) > max_exponent:
            raise CalculatorError(f"exponent {right} is larger than {max_exponent}")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** and parentheses")


def _checked(value: Any) -> Number:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise CalculatorError("the result is not a real number")
    if isinstance(value, int) and abs(value) >= 10 ** MAX_INT_DIGITS:
        raise CalculatorError(f"result has more than {MAX_INT_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not finite")
    return value


def format_number(value: Number) -> str:
    """Integers as integers (3.0 -> 3), other floats with up to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"


class CalculatorTool(BaseTool):
    """Tool arguments: {"expression": "<arithmetic>"}. config: max_chars, max_exponent."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        expression = parameters.get("expression")
        try:
            value = evaluate(expression, int(self.config.get("max_chars", MAX_EXPRESSION_CHARS)),
                             int(self.config.get("max_exponent", MAX_EXPONENT)))
        except CalculatorError as e:
            return f"Error: {e}", 0.0, {"error": 1.0}
        return format_number(value), 0.0, {}
