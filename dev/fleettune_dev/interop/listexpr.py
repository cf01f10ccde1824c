"""Safe evaluation of T1 value-list expressions such as ``[2**i for i in range(0, 6)]``.

T1 writes a parameter's values as a Python expression: a list literal, ``range``/``list(range())``,
lists joined with ``+``, or a comprehension over a range. This evaluates exactly that subset on
an `ast` whitelist (never eval): numbers, strings and booleans, arithmetic, ``range``, ``list``,
``+`` of lists, and single-``for`` comprehensions with optional ``if`` filters over a
comparison. Sizes are bounded so a hostile file cannot exhaust memory.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from fleettune.space.errors import SpaceError

MAX_ITEMS = 1_000_000
MAX_EXPONENT = 64

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.truediv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge}


def _err(field: str, text: str, node: ast.AST | None, message: str) -> SpaceError:
    if node is not None and hasattr(node, "col_offset"):
        snippet = ast.get_source_segment(text, node) or ""
        return SpaceError(field, message, position=node.col_offset + 1, snippet=snippet[:40])
    return SpaceError(field, message)


def evaluate_values(text: Any, field: str) -> list[Any]:
    """The value list a T1 ``Values`` entry describes (a list is accepted as it is)."""
    if isinstance(text, list):
        return text
    if not isinstance(text, str) or not text.strip():
        raise SpaceError(field, "expected a list or a list expression")
    source = " ".join(text.splitlines()).strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise SpaceError(field, f"syntax error: {exc.msg}", position=exc.offset) from None
    except (RecursionError, MemoryError, ValueError):
        raise SpaceError(field, "cannot parse the expression") from None

    def ev(node: ast.AST, env: dict[str, Any], depth: int) -> Any:
        if depth > 50:
            raise _err(field, source, node, "expression nested too deeply")
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [ev(e, env, depth + 1) for e in node.elts]
            if len(items) > MAX_ITEMS:
                raise _err(field, source, node, "too many values")
            return items
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in ("True", "False"):
                return node.id == "True"
            raise _err(field, source, node, f"unknown name {node.id!r}")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand, env, depth + 1)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise _err(field, source, node, "unary minus needs a number")
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            a, b = ev(node.left, env, depth + 1), ev(node.right, env, depth + 1)
            if isinstance(a, list) and isinstance(b, list) and isinstance(node.op, ast.Add):
                if len(a) + len(b) > MAX_ITEMS:
                    raise _err(field, source, node, "too many values")
                return a + b
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
                raise _err(field, source, node, "arithmetic needs numbers (lists can only be joined with +)")
            if isinstance(node.op, ast.Pow) and (abs(b) > MAX_EXPONENT or abs(a) > 2**32):
                raise _err(field, source, node, "power too large")
            try:
                return _BIN[type(node.op)](a, b)
            except ZeroDivisionError:
                raise _err(field, source, node, "division by zero") from None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            args = [ev(a, env, depth + 1) for a in node.args]
            if node.func.id == "range":
                if not 1 <= len(args) <= 3 or not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
                    raise _err(field, source, node, "range() takes 1 to 3 integers")
                r = range(*args)
                if len(r) > MAX_ITEMS:
                    raise _err(field, source, node, "range too long")
                return list(r)
            if node.func.id == "list" and len(args) == 1 and isinstance(args[0], list):
                return list(args[0])
            raise _err(field, source, node, f"calling {node.func.id!r} is not allowed here")
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            gen = node.generators[0]
            if not isinstance(gen.target, ast.Name) or gen.is_async:
                raise _err(field, source, gen.target, "the loop variable must be a plain name")
            seq = ev(gen.iter, env, depth + 1)
            if not isinstance(seq, list):
                raise _err(field, source, gen.iter, "a comprehension must loop over a list or range")
            out = []
            for item in seq:
                inner = {**env, gen.target.id: item}
                if all(ev_test(cond, inner, depth + 1) for cond in gen.ifs):
                    out.append(ev(node.elt, inner, depth + 1))
            return out
        raise _err(field, source, node, f"'{type(node).__name__}' is not allowed in a value list")

    def ev_test(node: ast.AST, env: dict[str, Any], depth: int) -> bool:
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
            return bool(_CMP[type(node.ops[0])](ev(node.left, env, depth), ev(node.comparators[0], env, depth)))
        raise _err(field, source, node, "a comprehension filter must be one comparison")

    try:
        value = ev(tree.body, {}, 0)
    except RecursionError:
        raise SpaceError(field, "expression nested too deeply") from None
    if not isinstance(value, list):
        raise SpaceError(field, f"expected a list of values, the expression gives {type(value).__name__}")
    return value
