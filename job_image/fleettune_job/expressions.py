"""A tiny, safe evaluator for launch-geometry and constraint expressions.

Expressions come from users (a TuningRun's grid/block expressions) and from the
built-in kernel descriptors, so they are parsed with :mod:`ast` and walked over a
whitelist of node types: arithmetic, comparisons, ``and``/``or``/``not``, ``x if c else
y``, names bound to parameter values, ``problem_size[i]`` and a few pure functions.
Nothing is ever handed to ``eval``. The job image must not depend on the operator
package, hence this small self-contained copy rather than ``fleettune.space``.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

Number = int | float | bool

MAX_EXPRESSION_CHARS = 500
# Guards against ``2 ** 10 ** 10`` style expressions that would hang the job.
MAX_POWER_EXPONENT = 64


class ExpressionError(ValueError):
    """An expression that cannot be parsed or evaluated."""


def _cdiv(a: Number, b: Number) -> int:
    """Ceiling division, the usual way to size a grid."""
    if b == 0:
        raise ZeroDivisionError("cdiv by zero")
    return -(-int(a) // int(b))


_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "ceil": math.ceil,
    "floor": math.floor,
    "cdiv": _cdiv,
}

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}

_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
    ast.Not: operator.not_,
}


@lru_cache(maxsize=512)
def parse(text: str) -> ast.Expression:
    """Parse and validate once; evaluation then only walks whitelisted nodes."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"invalid expression {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        _check_node(node, text)
    return tree


def _check_node(node: ast.AST, text: str) -> None:
    allowed = (
        ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp,
        ast.Constant, ast.Name, ast.Load, ast.Subscript, ast.Call, ast.And, ast.Or,
    )
    if isinstance(node, ast.operator | ast.unaryop | ast.cmpop):
        if type(node) not in _BINARY and type(node) not in _UNARY and type(node) not in _COMPARE:
            raise ExpressionError(f"operator {type(node).__name__} not allowed in {text!r}")
        return
    if not isinstance(node, allowed):
        raise ExpressionError(f"{type(node).__name__} not allowed in {text!r}")
    if isinstance(node, ast.Constant) and (
        isinstance(node.value, bool) or not isinstance(node.value, int | float)
    ):
        raise ExpressionError(f"only numeric constants are allowed in {text!r}")
    if isinstance(node, ast.Call) and (
        not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords
    ):
        raise ExpressionError(
            f"only calls to {', '.join(sorted(_FUNCTIONS))} with positional arguments are allowed in {text!r}"
        )
    if isinstance(node, ast.Subscript) and not (
        isinstance(node.value, ast.Name) and node.value.id == "problem_size"
    ):
        raise ExpressionError(f"only problem_size[i] may be indexed in {text!r}")


def evaluate(text: str, names: Mapping[str, Number], problem_size: Sequence[int] = ()) -> Number:
    """Evaluate ``text`` with parameter values ``names`` and ``problem_size``."""
    tree = parse(text)
    try:
        return _eval(tree.body, names, problem_size, text)
    except ExpressionError:
        raise
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise ExpressionError(f"cannot evaluate {text!r}: {exc}") from None


def _eval(node: ast.AST, names: Mapping[str, Number], ps: Sequence[int], text: str) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            if name in names:
                return names[name]
            if name in _FUNCTIONS:
                raise ExpressionError(f"function {name} used as a value in {text!r}")
            raise ExpressionError(f"unknown name {name!r} in {text!r}")
        case ast.Subscript(slice=index_node):
            index = _eval(index_node, names, ps, text)
            if isinstance(index, bool) or not isinstance(index, int):
                raise ExpressionError(f"problem_size index must be an integer in {text!r}")
            if not 0 <= index < len(ps):
                raise ExpressionError(
                    f"problem_size[{index}] out of range (problem size has {len(ps)} dimensions) in {text!r}"
                )
            return ps[index]
        case ast.UnaryOp(op=op, operand=operand):
            return _UNARY[type(op)](_eval(operand, names, ps, text))
        case ast.BinOp(left=left, op=op, right=right):
            lhs = _eval(left, names, ps, text)
            rhs = _eval(right, names, ps, text)
            if isinstance(op, ast.Pow) and abs(rhs) > MAX_POWER_EXPONENT:
                raise ExpressionError(f"exponent {rhs} too large in {text!r}")
            return _BINARY[type(op)](lhs, rhs)
        case ast.BoolOp(op=op, values=values):
            if isinstance(op, ast.And):
                result: Any = True
                for operand_node in values:
                    result = _eval(operand_node, names, ps, text)
                    if not result:
                        return result
                return result
            result = False
            for operand_node in values:
                result = _eval(operand_node, names, ps, text)
                if result:
                    return result
            return result
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            lhs = _eval(left, names, ps, text)
            for cmp_op, comparator in zip(ops, comparators, strict=True):
                rhs = _eval(comparator, names, ps, text)
                if not _COMPARE[type(cmp_op)](lhs, rhs):
                    return False
                lhs = rhs
            return True
        case ast.IfExp(test=test, body=body, orelse=orelse):
            branch = body if _eval(test, names, ps, text) else orelse
            return _eval(branch, names, ps, text)
        case ast.Call(func=ast.Name(id=fname), args=args):
            return _FUNCTIONS[fname](*(_eval(a, names, ps, text) for a in args))
    raise ExpressionError(f"unsupported expression {text!r}")  # unreachable after parse()


def dimension(text: str, names: Mapping[str, Number], problem_size: Sequence[int], what: str) -> int:
    """Evaluate one grid/block dimension: it must be a positive integer."""
    value = evaluate(text, names, problem_size)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExpressionError(f"{what} {text!r} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ExpressionError(f"{what} {text!r} = {value} is not an integer (use // or cdiv())")
        value = int(value)
    return value


def geometry(
    exprs: Sequence[str], names: Mapping[str, Number], problem_size: Sequence[int], what: str
) -> tuple[int, int, int]:
    """Evaluate 1 to 3 dimension expressions into a CUDA (x, y, z) triple (missing ones are 1).

    Zero or negative dimensions are returned as they are: CUDA rejects them at launch,
    which is the truthful "invalid configuration" answer for that configuration.
    """
    if not 1 <= len(exprs) <= 3:
        raise ExpressionError(f"{what} needs 1 to 3 expressions, got {len(exprs)}")
    dims = [dimension(e, names, problem_size, f"{what}[{i}]") for i, e in enumerate(exprs)]
    while len(dims) < 3:
        dims.append(1)
    return dims[0], dims[1], dims[2]
