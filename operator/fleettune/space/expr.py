"""Safe constraint expressions: parse with `ast`, check against a whitelist, compile to numpy.

A constraint such as ``32 <= block_size_x * block_size_y <= device.max_threads_per_block`` is
parsed with ``ast.parse(mode="eval")``; every node must be of a whitelisted kind (arithmetic,
comparisons and chains, ``and/or/not``, conditional expressions, ``in`` over literal tuples,
``min/max/abs``, ``device.<attr>``, and ``perm[i]`` on permutation parameters). The tree is
then compiled into a tree of closures that evaluate it on whole numpy arrays of parameter
values at once. Nothing is ever handed to eval/exec/compile.

Python semantics are kept where they matter for constraints: ``/`` is true division, ``//``
and ``%`` floor toward minus infinity, booleans count as 0/1 in arithmetic, and ``and``/``or``
short-circuit. A configuration for which Python would raise (division by zero, a complex
power) is *invalid*, not an error: each node returns an "error mask" next to its value, and the
masks are combined so that a short-circuited branch does not count (``b == 0 or a % b == 0``
is true for ``b == 0``). Integer arithmetic is int64; a power whose result does not fit is
computed in float64.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleettune.space.errors import SpaceError
from fleettune.space.params import Parameter

MAX_EXPRESSION_LENGTH = 4000
MAX_DEPTH = 60

# A compiled node maps an environment (parameter name → value array) to (value, error mask).
Value = Any  # np.ndarray or numpy scalar
Compiled = Callable[[Mapping[str, np.ndarray]], tuple[Value, Value | None]]

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}
_FORBIDDEN_BINOPS = {ast.BitAnd: ("&", "use 'and'"), ast.BitOr: ("|", "use 'or'"),
                     ast.BitXor: ("^", "use '**' for powers, '!=' for exclusive or"),
                     ast.LShift: ("<<", "use '* 2**n'"), ast.RShift: (">>", "use '// 2**n'"),
                     ast.MatMult: ("@", "")}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
           ast.In: "in", ast.NotIn: "not in"}
_FUNCTIONS = ("min", "max", "abs")
_NODE_NAMES = {
    ast.Lambda: "lambda expressions", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "generator expressions",
    ast.NamedExpr: "assignment expressions (:=)", ast.JoinedStr: "f-strings", ast.FormattedValue: "f-strings",
    ast.Starred: "starred expressions", ast.Dict: "dict literals", ast.Set: "set literals",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Slice: "slices",
}


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
        with np.errstate(all="ignore"):
            value, err = self._fn(env)
            ok = _truthy(value)
            if err is not None:
                ok = ok & ~err
        ok = np.asarray(ok, dtype=bool)
        return np.broadcast_to(ok, (n,)) if ok.shape != (n,) else ok


# ---------------------------------------------------------------------------------------------


class _Compiler:
    def __init__(self, text: str, field: str, params: Mapping[str, Parameter], device: Any):
        self.text = text
        self.field = field
        self.params = params
        self.device = device
        self.names: list[str] = []
        self.device_attrs: list[str] = []
        self._line_bytes = text.encode("utf-8")

    # -- errors --------------------------------------------------------------------------------
    def error(self, node: ast.AST | None, message: str) -> SpaceError:
        if node is None or not hasattr(node, "col_offset"):
            return SpaceError(self.field, message)
        start = len(self._line_bytes[: node.col_offset].decode("utf-8", errors="ignore"))
        end_off = getattr(node, "end_col_offset", None)
        end = len(self._line_bytes[:end_off].decode("utf-8", errors="ignore")) if end_off else start + 1
        snippet = self.text[start:end]
        if len(snippet) > 40:
            snippet = snippet[:37] + "..."
        return SpaceError(self.field, message, position=start + 1, snippet=snippet)

    # -- entry ---------------------------------------------------------------------------------
    def compile(self, node: ast.AST, depth: int = 0) -> tuple[Compiled, str]:
        """Compile ``node``; returns (function, kind) with kind in num, bool, str, perm, mixed."""
        if depth > MAX_DEPTH:
            raise self.error(node, f"expression is nested more than {MAX_DEPTH} levels deep")
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            what = _NODE_NAMES.get(type(node))
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
        return (lambda env: (const, None)), kind

    def _Name(self, node: ast.Name, depth: int) -> tuple[Compiled, str]:
        name = node.id
        if name == "device":
            raise self.error(node, "use 'device.<attribute>', e.g. device.max_threads_per_block")
        if name in _FUNCTIONS:
            raise self.error(node, f"'{name}' can only be called, e.g. {name}(a, b)")
        param = self.params.get(name)
        if param is None:
            close = difflib.get_close_matches(name, list(self.params), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise self.error(node, f"unknown parameter {name!r}{hint}")
        if name not in self.names:
            self.names.append(name)
        kind = param.value_kind
        if kind == "num" and param.array.dtype == bool:
            kind = "bool"
        return (lambda env: (env[name], None)), kind

    def _Attribute(self, node: ast.Attribute, depth: int) -> tuple[Compiled, str]:
        if not (isinstance(node.value, ast.Name) and node.value.id == "device"):
            raise self.error(node, "attribute access is only allowed as device.<attribute>")
        attr = node.attr
        if self.device is None:
            raise self.error(node, f"uses device.{attr} but no device is known for this target "
                                   "(give the target's GPU so its limits can be looked up)")
        from fleettune.space.devices import DEVICE_ATTRIBUTES

        if attr not in DEVICE_ATTRIBUTES or attr.startswith("_"):
            close = difflib.get_close_matches(attr, DEVICE_ATTRIBUTES, n=1)
            hint = f" (did you mean device.{close[0]}?)" if close else ""
            raise self.error(node, f"unknown device attribute {attr!r}{hint}")
        value = getattr(self.device, attr)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(node, f"device.{attr} is not a number")
        if attr not in self.device_attrs:
            self.device_attrs.append(attr)
        const = np.int64(value) if isinstance(value, int) else np.float64(value)
        return (lambda env: (const, None)), "num"

    def _Subscript(self, node: ast.Subscript, depth: int) -> tuple[Compiled, str]:
        target = node.value
        param = self.params.get(target.id) if isinstance(target, ast.Name) else None
        if param is None or param.type != "permutation":
            raise self.error(node, "indexing is only allowed on permutation parameters, e.g. order[0]")
        idx_node = node.slice
        pos = _literal_int(idx_node)
        if pos is None:
            raise self.error(idx_node, "the index of a permutation must be an integer literal")
        size = param.size or 0
        if not -size <= pos < size:
            raise self.error(idx_node, f"index {pos} is out of range for {param.name!r} (size {size})")
        self._Name(target, depth)
        column = param.permutation_table[:, pos].copy()
        name = param.name
        return (lambda env: (column[env[name]], None)), "num"

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
            return (lambda env: _map1(fn(env), lambda v: ~_truthy(v))), "bool"
        if isinstance(node.op, ast.Invert):
            raise self.error(node, "operator '~' is not allowed; use 'not'")
        if kind not in ("num", "bool"):
            raise self.error(node, f"unary {'-' if isinstance(node.op, ast.USub) else '+'} needs a number")
        if isinstance(node.op, ast.USub):
            return (lambda env: _map1(fn(env), lambda v: -_arith(v))), "num"
        return (lambda env: _map1(fn(env), _arith)), "num"

    def _BinOp(self, node: ast.BinOp, depth: int) -> tuple[Compiled, str]:
        if type(node.op) in _FORBIDDEN_BINOPS:
            sym, hint = _FORBIDDEN_BINOPS[type(node.op)]
            raise self.error(node, f"operator '{sym}' is not allowed" + (f"; {hint}" if hint else ""))
        sym = _BINOPS[type(node.op)]
        lf, lk = self.compile(node.left, depth)
        rf, rk = self.compile(node.right, depth)
        for k, side in ((lk, node.left), (rk, node.right)):
            if k not in ("num", "bool"):
                raise self.error(side, f"operator '{sym}' needs numbers, this is a {_KIND_WORDS[k]}")
        op = _ARITH[sym]

        def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
            a, ea = lf(env)
            b, eb = rf(env)
            value, e = op(_arith(a), _arith(b))
            return value, _or(_or(ea, eb), e)

        return run, "num"

    def _BoolOp(self, node: ast.BoolOp, depth: int) -> tuple[Compiled, str]:
        parts = [self.compile(v, depth) for v in node.values]
        is_and = isinstance(node.op, ast.And)
        all_bool = all(k == "bool" for _, k in parts)
        numeric = all(k in ("num", "bool") for _, k in parts)

        def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
            # Python: `a and b` is a if a is falsy else b; the error of b only counts where b is reached.
            value, err = parts[0][0](env)
            for fn, _ in parts[1:]:
                t = _truthy(value)
                reach = t if is_and else ~t
                v2, e2 = fn(env)
                if all_bool or not numeric:
                    value = (t & _truthy(v2)) if is_and else (t | _truthy(v2))
                else:
                    value = np.where(reach, _arith(v2), _arith(value))
                if e2 is not None:
                    err = _or(err, reach & e2)
            return value, err

        return run, ("bool" if all_bool or not numeric else "num")

    def _IfExp(self, node: ast.IfExp, depth: int) -> tuple[Compiled, str]:
        tf, _ = self.compile(node.test, depth)
        bf, bk = self.compile(node.body, depth)
        of, ok = self.compile(node.orelse, depth)
        if {bk, ok} - {"num", "bool"} and bk != ok:
            raise self.error(node, "both branches of a conditional expression must be of the same kind")
        kind = bk if bk == ok else "num"

        def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
            t, et = tf(env)
            t = _truthy(t)
            b, eb = bf(env)
            o, eo = of(env)
            if kind == "num":
                b, o = _arith(b), _arith(o)
            err = et
            if eb is not None:
                err = _or(err, t & eb)
            if eo is not None:
                err = _or(err, ~t & eo)
            return np.where(t, b, o), err

        return run, kind

    def _Call(self, node: ast.Call, depth: int) -> tuple[Compiled, str]:
        func = node.func
        if not isinstance(func, ast.Name) or func.id not in _FUNCTIONS:
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
                raise self.error(a, f"{func.id}() needs numbers, this is a {_KIND_WORDS[k]}")
        if func.id == "abs":
            if len(args) != 1:
                raise self.error(node, "abs() takes exactly one argument")
            f0 = args[0][0]
            return (lambda env: _map1(f0(env), lambda v: np.abs(_arith(v)))), "num"
        if len(args) < 2:
            raise self.error(node, f"{func.id}() needs at least two arguments here, e.g. {func.id}(a, b)")
        reducer = np.minimum if func.id == "min" else np.maximum
        fns = [f for f, _ in args]

        def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
            value, err = fns[0](env)
            value = _arith(value)
            for f in fns[1:]:
                v, e = f(env)
                value = reducer(value, _arith(v))
                err = _or(err, e)
            return value, err

        return run, "num"

    def _Compare(self, node: ast.Compare, depth: int) -> tuple[Compiled, str]:
        if len(node.ops) > 1 and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            raise self.error(node, "combine 'in' with other comparisons using 'and', not a chain")
        first_fn, left_kind = self.compile(node.left, depth)
        left_node = node.left
        steps = []
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            step, left_kind = self._comparison(op, left_node, left_kind, right_node, depth)
            steps.append(step)
            left_node = right_node

        def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
            # A chain a < b < c is (a < b) and (b < c) with b evaluated once; later links only
            # "happen" (can raise) where the earlier ones held.
            current, err = first_fn(env)
            result: Value = np.True_
            for step in steps:
                ok, current, e = step(current, env)
                if e is not None:
                    err = _or(err, result & e)
                result = result & ok
            return result, err

        return run, "bool"

    def _comparison(self, op: ast.cmpop, left_node: ast.AST, left_kind: str, right_node: ast.AST, depth: int):
        sym = _CMPOPS.get(type(op))
        if sym is None:  # `is`, `is not`
            raise self.error(right_node, f"'{'is' if isinstance(op, ast.Is) else 'is not'}' is not allowed; "
                                         "use == or !=")
        if sym in ("in", "not in"):
            members = self._literal_members(right_node, left_node, left_kind)
            negate = sym == "not in"

            def step_in(current: Value, env: Mapping[str, np.ndarray]) -> tuple[Value, Value, None]:
                hit = np.isin(current, members) if members.size else np.zeros(np.shape(current), dtype=bool)
                return (~hit if negate else hit), current, None

            return step_in, "bool"
        if sym in ("==", "!=") and left_kind == "perm" and _literal_tuple_of_ints(right_node) is not None:
            # order == (0, 2, 1): compare permutation indices
            members = self._literal_members(ast.Tuple(elts=[right_node]), left_node, left_kind)
            target = members[0]
            equal = sym == "=="

            def step_perm(current: Value, env: Mapping[str, np.ndarray]) -> tuple[Value, Value, None]:
                hit = np.asarray(current) == target
                return (hit if equal else ~hit), current, None

            return step_perm, "perm"
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
        cmp = _CMP_FUNCS[sym]
        numeric = kinds <= {"num", "bool"}

        def step(current: Value, env: Mapping[str, np.ndarray]) -> tuple[Value, Value, Value | None]:
            right, e = rf(env)
            a, b = (_arith(current), _arith(right)) if numeric else (current, right)
            return cmp(a, b), right, e

        return step, right_kind

    def _literal_members(self, node: ast.AST, left_node: ast.AST, left_kind: str) -> np.ndarray:
        if not isinstance(node, (ast.Tuple, ast.List)):
            raise self.error(node, "'in' needs a literal tuple on its right, e.g. x in (1, 2, 4)")
        if left_kind == "perm":
            param = self.params[left_node.id] if isinstance(left_node, ast.Name) else None
            if param is None:
                raise self.error(left_node, "'in' over permutations needs the parameter on the left")
            out = []
            for elt in node.elts:
                items = _literal_tuple_of_ints(elt)
                if items is None:
                    raise self.error(elt, f"expected a permutation literal such as {tuple(range(param.size or 0))}")
                idx = param.index_of(items)
                if idx is None:
                    raise self.error(elt, f"{items} is not a permutation of 0..{(param.size or 1) - 1}")
                out.append(idx)
            return np.array(out, dtype=np.int64)
        values = []
        for elt in node.elts:
            value = _literal_scalar(elt)
            if value is _NOT_LITERAL:
                raise self.error(elt, "the members of an 'in' tuple must be literal numbers or strings")
            if left_kind in ("num", "bool") and isinstance(value, str):
                raise self.error(elt, "comparing a number with a string: never true")
            if left_kind == "str" and not isinstance(value, str):
                raise self.error(elt, "comparing a string with a number: never true")
            values.append(value)
        if left_kind == "mixed":
            return np.array(values, dtype=object)
        return np.array(values)


_KIND_WORDS = {"num": "number", "bool": "boolean", "str": "string", "perm": "permutation",
               "mixed": "value of mixed type"}
_NOT_LITERAL = object()


def _literal_scalar(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str)):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    return _NOT_LITERAL


def _literal_int(node: ast.AST) -> int | None:
    v = _literal_scalar(node)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _literal_tuple_of_ints(node: ast.AST) -> tuple[int, ...] | None:
    if not isinstance(node, (ast.Tuple, ast.List)):
        return None
    items = [_literal_int(e) for e in node.elts]
    return None if any(i is None for i in items) else tuple(items)  # type: ignore[arg-type]


# -- vectorised semantics ---------------------------------------------------------------------


def _truthy(v: Value) -> Value:
    arr = np.asarray(v)
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind == "U":
        return arr != ""
    if arr.dtype.kind == "O":
        return np.vectorize(bool, otypes=[bool])(arr) if arr.ndim else np.bool_(bool(arr.item()))
    return arr != 0


def _arith(v: Value) -> Value:
    """Python treats True/False as 1/0 in arithmetic; numpy would do logical ops on bools."""
    arr = np.asarray(v)
    if arr.dtype == bool:
        return arr.astype(np.int64)
    return v


def _or(a: Value | None, b: Value | None) -> Value | None:
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def _map1(pair: tuple[Value, Value | None], f: Callable[[Value], Value]) -> tuple[Value, Value | None]:
    return f(pair[0]), pair[1]


def _is_int(v: Value) -> bool:
    return np.asarray(v).dtype.kind in "iu"


def _div(a: Value, b: Value) -> tuple[Value, Value]:
    zero = np.asarray(b) == 0
    return np.true_divide(a, np.where(zero, 1, b)), zero


def _floordiv(a: Value, b: Value) -> tuple[Value, Value]:
    zero = np.asarray(b) == 0
    return np.floor_divide(a, np.where(zero, 1, b)), zero


def _mod(a: Value, b: Value) -> tuple[Value, Value]:
    zero = np.asarray(b) == 0
    return np.mod(a, np.where(zero, 1, b)), zero


def _pow(a: Value, b: Value) -> tuple[Value, Value | None]:
    fa = np.asarray(a, dtype=np.float64)
    fb = np.asarray(b, dtype=np.float64)
    fres = np.power(fa, fb)
    # Python raises for 0 ** negative and returns complex for negative ** fractional: invalid here.
    err = ((fa == 0) & (fb < 0)) | (np.isnan(fres) & ~np.isnan(fa) & ~np.isnan(fb))
    if _is_int(a) and _is_int(b):
        # Exact int64 power while it fits (like Python ints); negative exponents give floats.
        fits = (fb >= 0) & (np.abs(fres) < 2.0**62)
        if np.all(fits):
            return np.power(np.asarray(a), np.asarray(b)), (err if err.any() else None)
        ires = np.power(np.asarray(a), np.where(fits, b, 0))
        return np.where(fits, ires, fres), (err if err.any() else None)
    return fres, (err if err.any() else None)


def _plain(fn: Callable[[Value, Value], Value]) -> Callable[[Value, Value], tuple[Value, None]]:
    return lambda a, b: (fn(a, b), None)


_ARITH: dict[str, Callable[[Value, Value], tuple[Value, Value | None]]] = {
    "+": _plain(np.add), "-": _plain(np.subtract), "*": _plain(np.multiply),
    "/": _div, "//": _floordiv, "%": _mod, "**": _pow,
}
_CMP_FUNCS: dict[str, Callable[[Value, Value], Value]] = {
    "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
    ">=": np.greater_equal,
}


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
