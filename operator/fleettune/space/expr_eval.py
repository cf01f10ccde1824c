"""Vectorised evaluation of constraint expressions: Python's semantics on whole numpy arrays.

The compiler (`fleettune.space.expr`) decides *whether* an expression is allowed and what
kind of value each node has; this module decides *what it computes*. It holds the closures a
checked expression is compiled into: each maps an environment (parameter name → array of
values, one per configuration) to ``(value, error mask)``, so that one call evaluates a
constraint for every configuration of a truth table or a batch of rows at once.

Python semantics are kept where they matter for constraints: ``/`` is true division, ``//``
and ``%`` floor toward minus infinity, booleans count as 0/1 in arithmetic, and ``and``/``or``
short-circuit. A configuration for which Python would raise (division by zero, a complex
power) is *invalid*, not an error: its error mask is set, and the masks are combined so that
a short-circuited branch does not count (``b == 0 or a % b == 0`` is true for ``b == 0``).
Integer arithmetic is int64; a power whose result does not fit is computed in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

# A compiled node maps an environment (parameter name → value array) to (value, error mask).
Value = Any  # np.ndarray or numpy scalar
Compiled = Callable[[Mapping[str, np.ndarray]], tuple[Value, Value | None]]
# One link of a comparison chain: (left value, env) → (result, right value, error mask).
Step = Callable[[Value, Mapping[str, np.ndarray]], tuple[Value, Value, Value | None]]


def validity(fn: Compiled, env: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Boolean validity of ``n`` configurations: the expression is true and raised nowhere."""
    with np.errstate(all="ignore"):
        value, err = fn(env)
        ok = truthy(value)
        if err is not None:
            ok = ok & ~err
    ok = np.asarray(ok, dtype=bool)
    return np.broadcast_to(ok, (n,)) if ok.shape != (n,) else ok


# -- primitives -------------------------------------------------------------------------------


def truthy(v: Value) -> Value:
    arr = np.asarray(v)
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind == "U":
        return arr != ""
    if arr.dtype.kind == "O":
        return np.vectorize(bool, otypes=[bool])(arr) if arr.ndim else np.bool_(bool(arr.item()))
    return arr != 0


def arith(v: Value) -> Value:
    """Python treats True/False as 1/0 in arithmetic; numpy would do logical ops on bools."""
    arr = np.asarray(v)
    if arr.dtype == bool:
        return arr.astype(np.int64)
    return v


def either(a: Value | None, b: Value | None) -> Value | None:
    """The union of two error masks (None: no error anywhere)."""
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


# -- nodes ------------------------------------------------------------------------------------


def constant(value: Value) -> Compiled:
    return lambda env: (value, None)


def column(name: str) -> Compiled:
    """A parameter's values."""
    return lambda env: (env[name], None)


def permutation_item(items: np.ndarray, name: str) -> Compiled:
    """``perm[i]``: ``items`` is column i of the permutation table; the env holds value indices."""
    return lambda env: (items[env[name]], None)


def unary(op: str, fn: Compiled) -> Compiled:
    """``not x`` (op "not"), ``-x`` or ``+x``."""
    if op == "not":
        return lambda env: _map1(fn(env), lambda v: ~truthy(v))
    if op == "-":
        return lambda env: _map1(fn(env), lambda v: -arith(v))
    return lambda env: _map1(fn(env), arith)


def binary(sym: str, lf: Compiled, rf: Compiled) -> Compiled:
    """Arithmetic ``a <sym> b``: + - * / // % **."""
    op = _ARITH[sym]

    def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
        a, ea = lf(env)
        b, eb = rf(env)
        value, e = op(arith(a), arith(b))
        return value, either(either(ea, eb), e)

    return run


def boolean(fns: Sequence[Compiled], is_and: bool, logical: bool) -> Compiled:
    """``a and b ...`` / ``a or b ...``; ``logical``: the result is a boolean, else the value
    of the operand Python would return (numbers only)."""

    def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
        # Python: `a and b` is a if a is falsy else b; the error of b only counts where b is reached.
        value, err = fns[0](env)
        for fn in fns[1:]:
            t = truthy(value)
            reach = t if is_and else ~t
            v2, e2 = fn(env)
            if logical:
                value = (t & truthy(v2)) if is_and else (t | truthy(v2))
            else:
                value = np.where(reach, arith(v2), arith(value))
            if e2 is not None:
                err = either(err, reach & e2)
        return value, err

    return run


def conditional(tf: Compiled, bf: Compiled, of: Compiled, numeric: bool) -> Compiled:
    """``b if t else o``; an error of a branch counts only where that branch is taken."""

    def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
        t, et = tf(env)
        t = truthy(t)
        b, eb = bf(env)
        o, eo = of(env)
        if numeric:
            b, o = arith(b), arith(o)
        err = et
        if eb is not None:
            err = either(err, t & eb)
        if eo is not None:
            err = either(err, ~t & eo)
        return np.where(t, b, o), err

    return run


def absolute(fn: Compiled) -> Compiled:
    return lambda env: _map1(fn(env), lambda v: np.abs(arith(v)))


def extremum(fns: Sequence[Compiled], smallest: bool) -> Compiled:
    """``min(a, b, ...)`` (``smallest``) or ``max(a, b, ...)``."""
    reducer = np.minimum if smallest else np.maximum

    def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
        value, err = fns[0](env)
        value = arith(value)
        for f in fns[1:]:
            v, e = f(env)
            value = reducer(value, arith(v))
            err = either(err, e)
        return value, err

    return run


def chain(first: Compiled, steps: Sequence[Step]) -> Compiled:
    """A comparison ``a < b < c``: the first operand, then one step per operator."""

    def run(env: Mapping[str, np.ndarray]) -> tuple[Value, Value | None]:
        # A chain a < b < c is (a < b) and (b < c) with b evaluated once; later links only
        # "happen" (can raise) where the earlier ones held.
        current, err = first(env)
        result: Value = np.True_
        for step in steps:
            ok, current, e = step(current, env)
            if e is not None:
                err = either(err, result & e)
            result = result & ok
        return result, err

    return run


def member_step(members: np.ndarray, negate: bool) -> Step:
    """``in`` / ``not in`` a literal tuple (of values, or of permutation indices)."""

    def step_in(current: Value, env: Mapping[str, np.ndarray]) -> tuple[Value, Value, None]:
        hit = np.isin(current, members) if members.size else np.zeros(np.shape(current), dtype=bool)
        return (~hit if negate else hit), current, None

    return step_in


def permutation_step(target: Value, equal: bool) -> Step:
    """``order == (0, 2, 1)`` / ``!=``: compares permutation indices."""

    def step_perm(current: Value, env: Mapping[str, np.ndarray]) -> tuple[Value, Value, None]:
        hit = np.asarray(current) == target
        return (hit if equal else ~hit), current, None

    return step_perm


def compare_step(sym: str, rf: Compiled, numeric: bool) -> Step:
    """``<sym> right``: == != < <= > >=; booleans count as numbers when ``numeric``."""
    cmp = _CMP_FUNCS[sym]

    def step(current: Value, env: Mapping[str, np.ndarray]) -> tuple[Value, Value, Value | None]:
        right, e = rf(env)
        a, b = (arith(current), arith(right)) if numeric else (current, right)
        return cmp(a, b), right, e

    return step
