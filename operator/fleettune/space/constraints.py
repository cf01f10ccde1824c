"""A space's constraints, compiled for the solver: truth tables, residual checks, emptiness.

A checked constraint (`fleettune.space.expr.Constraint`) evaluates arrays of values; the
solver (`fleettune.space.enumeration.Solver`) works on 0/1 tables over the parameters each
constraint names (its *scope*). This module is the step between them. Each constraint whose
scope is small enough is evaluated once on the Cartesian product of its scope into a truth
table (tables of the same scope are merged); a wider one stays a *residual*, evaluated on the
rows the solver proposes. The same tables then answer "is this row valid" without evaluating
the expression again, and, when no configuration is left, tell the user *which* constraint
emptied the space, so the error names a field of the spec rather than the space as a whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fleettune.space.devices import DeviceLimits
from fleettune.space.enumeration import (
    CHUNK_ROWS,
    TRUTH_TABLE_LIMIT,
    Factor,
    Residual,
    Solver,
    choose_residuals,
)
from fleettune.space.errors import SpaceError
from fleettune.space.expr import Constraint
from fleettune.space.params import Parameter


class ConstraintSet:
    """The constraints over ``parameters`` as truth tables and residuals, and their `Solver`."""

    def __init__(self, parameters: Sequence[Parameter], constraints: Sequence[Constraint]):
        self.parameters: tuple[Parameter, ...] = tuple(parameters)
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self.names: tuple[str, ...] = tuple(p.name for p in self.parameters)
        self.sizes: tuple[int, ...] = tuple(len(p.values) for p in self.parameters)
        index = {name: j for j, name in enumerate(self.names)}
        # Per constraint: the parameters it reads (sorted column indices) and its truth table
        # (None for a residual).
        self.scopes = [tuple(sorted(index[n] for n in c.names)) for c in self.constraints]
        self.tables: list[np.ndarray | None] = []
        self.constant_false: list[int] = []  # constraints no configuration satisfies
        self._build()

    def _build(self) -> None:
        sizes = self.sizes
        too_big = [math.prod(sizes[j] for j in s) > TRUTH_TABLE_LIMIT for s in self.scopes]
        residual = choose_residuals(sizes, [s for s, big in zip(self.scopes, too_big, strict=True) if not big])
        it = iter(residual)
        is_residual = [True if big else next(it) for big in too_big]
        merged: dict[tuple[int, ...], np.ndarray] = {}
        residuals: list[Residual] = []
        for k, scope in enumerate(self.scopes):
            if is_residual[k]:
                self.tables.append(None)
                residuals.append(Residual(scope, self._residual_check(k)))
                continue
            table = self._truth_table(k)
            self.tables.append(table)
            if not table.any():
                self.constant_false.append(k)
            merged[scope] = table if scope not in merged else (merged[scope] & table)
        self.residual_flags = is_residual
        self.solver = Solver(sizes, [Factor(s, t) for s, t in merged.items()], residuals)

    def _truth_table(self, k: int) -> np.ndarray:
        """Constraint k evaluated on the Cartesian product of its own parameters."""
        scope = self.scopes[k]
        shape = tuple(self.sizes[j] for j in scope)
        total = math.prod(shape)
        out = np.empty(total, dtype=bool)
        for start in range(0, total, CHUNK_ROWS):
            stop = min(total, start + CHUNK_ROWS)
            idx = np.unravel_index(np.arange(start, stop), shape) if shape else ()
            cols = {j: idx[i] for i, j in enumerate(scope)}
            out[start:stop] = self.evaluate(k, cols, stop - start)
        return out.reshape(shape)

    def evaluate(self, k: int, cols: Mapping[int, np.ndarray], n: int) -> np.ndarray:
        """Constraint k on ``n`` configurations, given the value-index columns of its scope."""
        c = self.constraints[k]
        env = {self.names[j]: self.parameters[j].array[cols[j]] for j in self.scopes[k]}
        try:
            return c.evaluate(env, n)
        except (TypeError, ValueError, ArithmeticError) as exc:  # e.g. numpy refusing an operation on a type
            raise SpaceError(c.field, f"cannot evaluate {c.text!r}: {exc}") from None

    def _residual_check(self, k: int) -> Callable[[Mapping[int, np.ndarray], int], np.ndarray]:
        return lambda cols, n: self.evaluate(k, cols, n)

    def satisfied(self, safe: np.ndarray) -> np.ndarray:
        """Boolean per row: every constraint holds. ``safe``: index rows known to be in range."""
        n = safe.shape[0]
        ok = np.ones(n, dtype=bool)
        for k, scope in enumerate(self.scopes):
            table = self.tables[k]
            if table is not None:
                ok &= table[tuple(safe[:, j] for j in scope)] if scope else bool(table)
            else:
                ok &= self.evaluate(k, {j: safe[:, j] for j in scope}, n)
        return ok

    def exists(self) -> bool:
        """Whether at least one configuration satisfies every constraint."""
        if self.solver.superset_count == 0:
            return False
        if not self.solver.residuals:
            return True
        return next(iter(self.solver.iter_blocks()), None) is not None

    def check_not_empty(self, device: DeviceLimits | None) -> None:
        """`SpaceError` naming the constraint that leaves no valid configuration, if one does."""
        if self.exists():
            return
        if self.constant_false:
            k = self.constant_false[0]
            c = self.constraints[k]
            if c.names:
                raise SpaceError(c.field, f"no value of {', '.join(c.names)} satisfies {c.text!r}: "
                                          "no valid configuration is left")
            name = device.name if device is not None else "the device"
            raise SpaceError(c.field, f"{name} does not satisfy {c.text!r}: no valid configuration is left")
        # Find the first constraint that, added to those before it, empties the space.
        for k in range(1, len(self.constraints) + 1):
            if not ConstraintSet(self.parameters, self.constraints[:k]).exists():
                c = self.constraints[k - 1]
                before = f" together with constraints[0..{k - 2}]" if k > 1 else ""
                raise SpaceError(c.field, f"{c.text!r}{before} leaves no valid configuration") from None
        raise SpaceError("constraints", "the constraints leave no valid configuration")
