"""A bounded arithmetic evaluator for expressions found in model text.

Model text is data: it is never passed to `eval`. This parses with `ast` in `eval` mode, accepts
only numeric literals, + - * / (also × ÷ x), unary minus and parentheses, and bounds the input
length, the nesting depth and the size of every intermediate value.
"""

from __future__ import annotations

import ast
import math
from fractions import Fraction

MAX_CHARS = 200
MAX_DEPTH = 32
MAX_ABS = 10**12


class ArithmeticError_(ValueError):
    """The text is not a bounded arithmetic expression."""


def _normalise(expr: str) -> str:
    return expr.replace("×", "*").replace("÷", "/").replace("−", "-").replace(",", "").strip()


def evaluate(expr: str) -> Fraction:
    """Value of an arithmetic expression as an exact Fraction; raises ArithmeticError_ otherwise."""
    text = _normalise(expr)
    if not text or len(text) > MAX_CHARS:
        raise ArithmeticError_(f"expression empty or longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as err:
        raise ArithmeticError_(f"not an arithmetic expression: {text!r}") from err
    return _eval(tree.body, 0)


def _check(value: Fraction) -> Fraction:
    if abs(value) > MAX_ABS:
        raise ArithmeticError_("intermediate value out of bounds")
    return value


def _eval(node: ast.AST, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise ArithmeticError_("expression nested too deeply")
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        if isinstance(node.value, float) and not math.isfinite(node.value):  # 1e999 reads as inf
            raise ArithmeticError_(f"literal out of range: {node.value!r}")
        return _check(Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left = _eval(node.left, depth + 1)
        right = _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Add):
            return _check(left + right)
        if isinstance(node.op, ast.Sub):
            return _check(left - right)
        if isinstance(node.op, ast.Mult):
            return _check(left * right)
        if right == 0:
            raise ArithmeticError_("division by zero")
        return _check(left / right)
    raise ArithmeticError_(f"unsupported element {type(node).__name__}")


def try_evaluate(expr: str) -> Fraction | None:
    """Like `evaluate`, but None instead of an error."""
    try:
        return evaluate(expr)
    except ArithmeticError_:
        return None
