"""The vocabulary of constraint expressions: what may be written, and how a refusal names it.

The compiler (`fleettune.space.expr`) walks a parsed expression against these tables: the
operators and functions that are allowed, the syntax that is not (with the name a message
gives it and, for look-alike operators, what to write instead), the words for the kinds of
values, and the readers of literals (``x in (1, 2)``, ``order[0]``, ``order == (0, 2, 1)``).
`error_at` turns a refusal into a `SpaceError` that points at the offending column, so that
the user sees where in the expression the problem is.
"""

from __future__ import annotations

import ast
from typing import Any

from fleettune.space.errors import SpaceError

BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
          ast.Pow: "**"}
FORBIDDEN_BINOPS = {ast.BitAnd: ("&", "use 'and'"), ast.BitOr: ("|", "use 'or'"),
                    ast.BitXor: ("^", "use '**' for powers, '!=' for exclusive or"),
                    ast.LShift: ("<<", "use '* 2**n'"), ast.RShift: (">>", "use '// 2**n'"),
                    ast.MatMult: ("@", "")}
CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
          ast.In: "in", ast.NotIn: "not in"}
FUNCTIONS = ("min", "max", "abs")
NODE_NAMES = {
    ast.Lambda: "lambda expressions", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "generator expressions",
    ast.NamedExpr: "assignment expressions (:=)", ast.JoinedStr: "f-strings", ast.FormattedValue: "f-strings",
    ast.Starred: "starred expressions", ast.Dict: "dict literals", ast.Set: "set literals",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Slice: "slices",
}
# The kinds of value the compiler tracks, as messages say them.
KIND_WORDS = {"num": "number", "bool": "boolean", "str": "string", "perm": "permutation",
              "mixed": "value of mixed type"}


def error_at(text: str, field: str, node: ast.AST | None, message: str) -> SpaceError:
    """A `SpaceError` for ``field`` pointing at ``node``'s column (and snippet) in ``text``."""
    if node is None or not hasattr(node, "col_offset"):
        return SpaceError(field, message)
    line_bytes = text.encode("utf-8")  # ast's offsets count UTF-8 bytes
    start = len(line_bytes[: node.col_offset].decode("utf-8", errors="ignore"))
    end_off = getattr(node, "end_col_offset", None)
    end = len(line_bytes[:end_off].decode("utf-8", errors="ignore")) if end_off else start + 1
    snippet = text[start:end]
    if len(snippet) > 40:
        snippet = snippet[:37] + "..."
    return SpaceError(field, message, position=start + 1, snippet=snippet)


NOT_LITERAL = object()


def literal_scalar(node: ast.AST) -> Any:
    """The number or string a literal (or a signed number) stands for, else `NOT_LITERAL`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str)):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    return NOT_LITERAL


def literal_int(node: ast.AST) -> int | None:
    v = literal_scalar(node)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def literal_tuple_of_ints(node: ast.AST) -> tuple[int, ...] | None:
    if not isinstance(node, (ast.Tuple, ast.List)):
        return None
    items = [i for i in map(literal_int, node.elts) if i is not None]
    return tuple(items) if len(items) == len(node.elts) else None
