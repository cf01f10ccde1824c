"""Safe constraint expressions: parse with `ast`, check against a whitelist, compile to numpy.

A constraint such as ``32 <= block_size_x * block_size_y <= device.max_threads_per_block`` is
parsed with ``ast.parse(mode="eval")``; every node must be of a whitelisted kind (arithmetic,
comparisons and chains, ``and/or/not``, conditional expressions, ``in`` over literal tuples,
``min/max/abs``, ``device.<attr>``, and ``perm[i]`` on permutation parameters). The tree is
then compiled into a tree of closures that evaluate it on whole numpy arrays of parameter
values at once. Nothing is ever handed to eval/exec/compile.

This module parses and checks: it knows the parameters and the device, tracks the kind of
every node (number, boolean, string, permutation, mixed) and refuses what cannot mean
anything. What the closures compute, with Python's semantics on arrays, is
`fleettune.space.expr_eval`; the allowed vocabulary and the wording of refusals are
`fleettune.space.expr_syntax`.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleettune.names import did_you_mean
from fleettune.space import expr_eval as ev
from fleettune.space.errors import SpaceError
from fleettune.space.expr_eval import Compiled, Step
from fleettune.space.expr_syntax import (
    BINOPS,
    CMPOPS,
    FORBIDDEN_BINOPS,
    FUNCTIONS,
    KIND_WORDS,
    NODE_NAMES,
    NOT_LITERAL,
    error_at,
    literal_int,
    literal_scalar,
    literal_tuple_of_ints,
)
from fleettune.space.params import Parameter

MAX_EXPRESSION_LENGTH = 4000
MAX_DEPTH = 60


@dataclass(frozen=True)
class Constraint:
    """A checked, compiled constraint expression."""

    text: str
    field: str  # "constraints[i]"
    names: tuple[str, ...]  # parameters it reads, in order of first appearance
    device_attrs: tuple[str, ...]
    _fn: Compiled

    def evaluate(self, env: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """Boolean validity for ``n`` configurations given their parameter value arrays."""
        return ev.validity(self._fn, env, n)


# ---------------------------------------------------------------------------------------------


class _Compiler:
    def __init__(self, text: str, field: str, params: Mapping[str, Parameter], device: Any):
        self.text = text
        self.field = field
        self.params = params
        self.device = device
        self.names: list[str] = []
        self.device_attrs: list[str] = []

    def error(self, node: ast.AST | None, message: str) -> SpaceError:
        return error_at(self.text, self.field, node, message)

    # -- entry ---------------------------------------------------------------------------------
    def compile(self, node: ast.AST, depth: int = 0) -> tuple[Compiled, str]:
        """Compile ``node``; returns (function, kind) with kind in num, bool, str, perm, mixed."""
        if depth > MAX_DEPTH:
            raise self.error(node, f"expression is nested more than {MAX_DEPTH} levels deep")
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            what = NODE_NAMES.get(type(node))
            if what is None:
                what = f"'{type(node).__name__}' syntax"
            raise self.error(node, f"{what} not allowed in constraints")
        return method(node, depth + 1)

    # -- leaves --------------------------------------------------------------------------------
    def _Constant(self, node: ast.Constant, depth: int) -> tuple[Compiled, str]:
        v = node.value
        if isinstance(v, bool):
            const: Any = np.bool_(v)
            kind = "bool"
        elif isinstance(v, int):
            const = np.int64(v) if -(2**62) < v < 2**62 else np.float64(v)
            kind = "num"
        elif isinstance(v, float):
            const, kind = np.float64(v), "num"
        elif isinstance(v, str):
            const, kind = np.str_(v), "str"
        else:
            raise self.error(node, f"the literal {v!r} is not allowed (numbers, strings, True, False only)")
        return ev.constant(const), kind

    def _Name(self, node: ast.Name, depth: int) -> tuple[Compiled, str]:
        name = node.id
        if name == "device":
            raise self.error(node, "use 'device.<attribute>', e.g. device.max_threads_per_block")
        if name in FUNCTIONS:
            raise self.error(node, f"'{name}' can only be called, e.g. {name}(a, b)")
        param = self.params.get(name)
        if param is None:
            raise self.error(node, f"unknown parameter {name!r}{did_you_mean(name, self.params)}")
        if name not in self.names:
            self.names.append(name)
        kind = param.value_kind
        if kind == "num" and param.array.dtype == bool:
            kind = "bool"
        return ev.column(name), kind

    def _Attribute(self, node: ast.Attribute, depth: int) -> tuple[Compiled, str]:
        if not (isinstance(node.value, ast.Name) and node.value.id == "device"):
            raise self.error(node, "attribute access is only allowed as device.<attribute>")
        attr = node.attr
        if self.device is None:
            raise self.error(node, f"uses device.{attr} but no device is known for this target "
                                   "(give the target's GPU so its limits can be looked up)")
        from fleettune.space.devices import DEVICE_ATTRIBUTES

        if attr not in DEVICE_ATTRIBUTES or attr.startswith("_"):
            hint = did_you_mean(attr, DEVICE_ATTRIBUTES, "device.{}")
            raise self.error(node, f"unknown device attribute {attr!r}{hint}")
        value = getattr(self.device, attr)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(node, f"device.{attr} is not a number")
        if attr not in self.device_attrs:
            self.device_attrs.append(attr)
        const = np.int64(value) if isinstance(value, int) else np.float64(value)
        return ev.constant(const), "num"

    def _Subscript(self, node: ast.Subscript, depth: int) -> tuple[Compiled, str]:
        target = node.value
        param = self.params.get(target.id) if isinstance(target, ast.Name) else None
        if not isinstance(target, ast.Name) or param is None or param.type != "permutation":
            raise self.error(node, "indexing is only allowed on permutation parameters, e.g. order[0]")
        idx_node = node.slice
        pos = literal_int(idx_node)
        if pos is None:
            raise self.error(idx_node, "the index of a permutation must be an integer literal")
        size = param.size or 0
        if not -size <= pos < size:
            raise self.error(idx_node, f"index {pos} is out of range for {param.name!r} (size {size})")
        self._Name(target, depth)
        return ev.permutation_item(param.permutation_table[:, pos].copy(), param.name), "num"

    # -- operators -----------------------------------------------------------------------------
    def _Tuple(self, node: ast.Tuple, depth: int) -> tuple[Compiled, str]:
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                raise self.error(elt, "starred expressions not allowed in constraints")
        raise self.error(node, "a tuple is only allowed after 'in' (x in (1, 2)) or compared with a permutation")

    _List = _Tuple

    def _UnaryOp(self, node: ast.UnaryOp, depth: int) -> tuple[Compiled, str]:
        fn, kind = self.compile(node.operand, depth)
        if isinstance(node.op, ast.Not):
            return ev.unary("not", fn), "bool"
        if isinstance(node.op, ast.Invert):
            raise self.error(node, "operator '~' is not allowed; use 'not'")
        if kind not in ("num", "bool"):
            raise self.error(node, f"unary {'-' if isinstance(node.op, ast.USub) else '+'} needs a number")
        return ev.unary("-" if isinstance(node.op, ast.USub) else "+", fn), "num"

    def _BinOp(self, node: ast.BinOp, depth: int) -> tuple[Compiled, str]:
        if type(node.op) in FORBIDDEN_BINOPS:
            sym, hint = FORBIDDEN_BINOPS[type(node.op)]
            raise self.error(node, f"operator '{sym}' is not allowed" + (f"; {hint}" if hint else ""))
        sym = BINOPS[type(node.op)]
        lf, lk = self.compile(node.left, depth)
        rf, rk = self.compile(node.right, depth)
        for k, side in ((lk, node.left), (rk, node.right)):
            if k not in ("num", "bool"):
                raise self.error(side, f"operator '{sym}' needs numbers, this is a {KIND_WORDS[k]}")
        return ev.binary(sym, lf, rf), "num"

    def _BoolOp(self, node: ast.BoolOp, depth: int) -> tuple[Compiled, str]:
        parts = [self.compile(v, depth) for v in node.values]
        is_and = isinstance(node.op, ast.And)
        all_bool = all(k == "bool" for _, k in parts)
        numeric = all(k in ("num", "bool") for _, k in parts)
        logical = all_bool or not numeric
        return ev.boolean([fn for fn, _ in parts], is_and, logical), ("bool" if logical else "num")

    def _IfExp(self, node: ast.IfExp, depth: int) -> tuple[Compiled, str]:
        tf, _ = self.compile(node.test, depth)
        bf, bk = self.compile(node.body, depth)
        of, ok = self.compile(node.orelse, depth)
        if {bk, ok} - {"num", "bool"} and bk != ok:
            raise self.error(node, "both branches of a conditional expression must be of the same kind")
        kind = bk if bk == ok else "num"
        return ev.conditional(tf, bf, of, numeric=kind == "num"), kind

    def _Call(self, node: ast.Call, depth: int) -> tuple[Compiled, str]:
        func = node.func
        if not isinstance(func, ast.Name) or func.id not in FUNCTIONS:
            shown = func.id if isinstance(func, ast.Name) else ast.unparse(func)
            raise self.error(node, f"calling {shown!r} is not allowed; only min(), max() and abs() are")
        if node.keywords:
            raise self.error(node.keywords[0].value, f"{func.id}() takes no keyword arguments")
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise self.error(a, "starred arguments are not allowed")
        args = [self.compile(a, depth) for a in node.args]
        for (_, k), a in zip(args, node.args, strict=True):
            if k not in ("num", "bool"):
                raise self.error(a, f"{func.id}() needs numbers, this is a {KIND_WORDS[k]}")
        if func.id == "abs":
            if len(args) != 1:
                raise self.error(node, "abs() takes exactly one argument")
            f0 = args[0][0]
            return ev.absolute(f0), "num"
        if len(args) < 2:
            raise self.error(node, f"{func.id}() needs at least two arguments here, e.g. {func.id}(a, b)")
        return ev.extremum([f for f, _ in args], smallest=func.id == "min"), "num"

    def _Compare(self, node: ast.Compare, depth: int) -> tuple[Compiled, str]:
        if len(node.ops) > 1 and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            raise self.error(node, "combine 'in' with other comparisons using 'and', not a chain")
        first_fn, left_kind = self.compile(node.left, depth)
        left_node = node.left
        steps: list[Step] = []
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            step, left_kind = self._comparison(op, left_node, left_kind, right_node, depth)
            steps.append(step)
            left_node = right_node
        return ev.chain(first_fn, steps), "bool"

    def _comparison(self, op: ast.cmpop, left_node: ast.expr, left_kind: str, right_node: ast.expr,
                    depth: int) -> tuple[Step, str]:
        sym = CMPOPS.get(type(op))
        if sym is None:  # `is`, `is not`
            raise self.error(right_node, f"'{'is' if isinstance(op, ast.Is) else 'is not'}' is not allowed; "
                                         "use == or !=")
        if sym in ("in", "not in"):
            members = self._literal_members(right_node, left_node, left_kind)
            return ev.member_step(members, negate=sym == "not in"), "bool"
        if sym in ("==", "!=") and left_kind == "perm" and literal_tuple_of_ints(right_node) is not None:
            # order == (0, 2, 1): compare permutation indices
            members = self._literal_members(ast.Tuple(elts=[right_node]), left_node, left_kind)
            return ev.permutation_step(members[0], equal=sym == "=="), "perm"
        rf, right_kind = self.compile(right_node, depth)
        if left_kind == "perm" or right_kind == "perm":
            raise self.error(right_node if right_kind == "perm" else left_node,
                             "a permutation can only be compared with 'in' over literal tuples, "
                             "or indexed (order[0] == 2)")
        kinds = {left_kind, right_kind}
        if "str" in kinds and kinds & {"num", "bool"}:
            raise self.error(right_node, f"comparing a string with a number: {sym} is never true here")
        if sym not in ("==", "!=") and "mixed" in kinds:
            raise self.error(right_node, f"'{sym}' needs both sides of the same type (this parameter mixes types)")
        return ev.compare_step(sym, rf, numeric=kinds <= {"num", "bool"}), right_kind

    def _literal_members(self, node: ast.AST, left_node: ast.AST, left_kind: str) -> np.ndarray:
        if not isinstance(node, (ast.Tuple, ast.List)):
            raise self.error(node, "'in' needs a literal tuple on its right, e.g. x in (1, 2, 4)")
        if left_kind == "perm":
            param = self.params[left_node.id] if isinstance(left_node, ast.Name) else None
            if param is None:
                raise self.error(left_node, "'in' over permutations needs the parameter on the left")
            out = []
            for elt in node.elts:
                items = literal_tuple_of_ints(elt)
                if items is None:
                    raise self.error(elt, f"expected a permutation literal such as {tuple(range(param.size or 0))}")
                idx = param.index_of(items)
                if idx is None:
                    raise self.error(elt, f"{items} is not a permutation of 0..{(param.size or 1) - 1}")
                out.append(idx)
            return np.array(out, dtype=np.int64)
        values = []
        for elt in node.elts:
            value = literal_scalar(elt)
            if value is NOT_LITERAL:
                raise self.error(elt, "the members of an 'in' tuple must be literal numbers or strings")
            if left_kind in ("num", "bool") and isinstance(value, str):
                raise self.error(elt, "comparing a number with a string: never true")
            if left_kind == "str" and not isinstance(value, str):
                raise self.error(elt, "comparing a string with a number: never true")
            values.append(value)
        if left_kind == "mixed":
            return np.array(values, dtype=object)
        return np.array(values)


# ---------------------------------------------------------------------------------------------


def parse_constraint(text: Any, field: str, params: Mapping[str, Parameter], device: Any = None) -> Constraint:
    """Parse, check and compile one constraint; every problem is a `SpaceError` naming ``field``."""
    if not isinstance(text, str):
        raise SpaceError(field, f"a constraint is a string expression, got {type(text).__name__}")
    if "\x00" in text:
        raise SpaceError(field, "the expression contains a NUL character")
    # Joining lines keeps columns meaningful and lets a YAML block scalar hold a long constraint.
    source = " ".join(text.splitlines()).strip()
    if not source:
        raise SpaceError(field, "the constraint is empty")
    if len(source) > MAX_EXPRESSION_LENGTH:
        raise SpaceError(field, f"the expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        col = exc.offset if exc.offset and exc.offset > 0 else None
        snippet = source[col - 1: col + 19] if col else None
        msg = (exc.msg or "invalid syntax").replace("invalid syntax. Perhaps you forgot a comma?", "invalid syntax")
        raise SpaceError(field, f"syntax error: {msg}", position=col, snippet=snippet) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise SpaceError(field, f"cannot parse the expression: {type(exc).__name__}") from None
    compiler = _Compiler(source, field, params, device)
    try:
        fn, _ = compiler.compile(tree.body)
    except RecursionError:
        raise SpaceError(field, f"expression is nested more than {MAX_DEPTH} levels deep") from None
    return Constraint(text=source, field=field, names=tuple(compiler.names),
                      device_attrs=tuple(compiler.device_attrs), _fn=fn)
