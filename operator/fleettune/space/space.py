"""`SearchSpace`: typed parameters + known constraints (+ the target's device limits).

A configuration is handled as an *index row*: one int32 per parameter, the position of its
value in that parameter's value list (``space.parameters[j].values``). Rows are what the
optimiser stores and models; `to_configs` turns them into plain values for Jobs and results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from fleettune.space.devices import DeviceLimits
from fleettune.space.encode import Encoding, build_encoding
from fleettune.space.enumeration import (
    CHUNK_ROWS,
    TRUTH_TABLE_LIMIT,
    Factor,
    Residual,
    Solver,
    choose_residuals,
)
from fleettune.space.errors import SpaceError
from fleettune.space.expr import Constraint, parse_constraint
from fleettune.space.params import Parameter, parse_parameter

# enumerate() refuses to build an array larger than this; use limit= or sample() instead.
MAX_ENUMERATE_BYTES = 8 << 30
_SLAB = 1 << 14
_MAX_PATTERN = 1 << 16  # rows of the free-parameter product written by pattern


class SearchSpace:
    """A validated search space. Build it with `SearchSpace.from_spec`."""

    def __init__(self, parameters: Sequence[Parameter], constraints: Sequence[Constraint] = (),
                 device: DeviceLimits | None = None, *, check_not_empty: bool = True):
        self.parameters: tuple[Parameter, ...] = tuple(parameters)
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self.device = device
        self.names: tuple[str, ...] = tuple(p.name for p in self.parameters)
        self.sizes: tuple[int, ...] = tuple(len(p.values) for p in self.parameters)
        self._index = {name: j for j, name in enumerate(self.names)}
        self._scopes = [tuple(sorted(self._index[n] for n in c.names)) for c in self.constraints]
        self._tables: list[np.ndarray | None] = []
        self._constant_false: list[int] = []
        self._build()
        if check_not_empty:
            self._check_not_empty()

    # ---------------------------------------------------------------------------------------
    # construction

    @classmethod
    def from_spec(cls, parameters: Any, constraints: Any = None, device: DeviceLimits | None = None) -> SearchSpace:
        """Validate CRD-shaped parameter dicts and constraint strings; raises `SpaceError`."""
        if not isinstance(parameters, (list, tuple)):
            raise SpaceError("parameters", f"expected a list of parameters, got {type(parameters).__name__}")
        if not parameters:
            raise SpaceError("parameters", "at least one parameter is required")
        params: list[Parameter] = []
        seen: dict[str, int] = {}
        for i, spec in enumerate(parameters):
            p = parse_parameter(spec, i)
            if p.name in seen:
                raise SpaceError(f"parameters[{i}].name", f"duplicate parameter name {p.name!r} "
                                                          f"(also parameters[{seen[p.name]}])")
            seen[p.name] = i
            params.append(p)
        if constraints is None:
            constraints = []
        if isinstance(constraints, str) or not isinstance(constraints, (list, tuple)):
            raise SpaceError("constraints", f"expected a list of expressions, got {type(constraints).__name__}")
        by_name = {p.name: p for p in params}
        compiled = [parse_constraint(c, f"constraints[{i}]", by_name, device) for i, c in enumerate(constraints)]
        return cls(params, compiled, device)

    def _truth_table(self, k: int) -> np.ndarray:
        """Constraint k evaluated on the Cartesian product of its own parameters."""
        scope = self._scopes[k]
        shape = tuple(self.sizes[j] for j in scope)
        total = math.prod(shape)
        out = np.empty(total, dtype=bool)
        for start in range(0, total, CHUNK_ROWS):
            stop = min(total, start + CHUNK_ROWS)
            idx = np.unravel_index(np.arange(start, stop), shape) if shape else ()
            cols = {j: idx[i] for i, j in enumerate(scope)}
            out[start:stop] = self._evaluate(k, cols, stop - start)
        return out.reshape(shape)

    def _evaluate(self, k: int, cols: Mapping[int, np.ndarray], n: int) -> np.ndarray:
        c = self.constraints[k]
        env = {self.names[j]: self.parameters[j].array[cols[j]] for j in self._scopes[k]}
        try:
            return c.evaluate(env, n)
        except (TypeError, ValueError, ArithmeticError) as exc:  # e.g. numpy refusing an operation on a type
            raise SpaceError(c.field, f"cannot evaluate {c.text!r}: {exc}") from None

    def _build(self) -> None:
        sizes = self.sizes
        too_big = [math.prod(sizes[j] for j in s) > TRUTH_TABLE_LIMIT for s in self._scopes]
        residual = choose_residuals(sizes, [s for s, big in zip(self._scopes, too_big, strict=True) if not big])
        it = iter(residual)
        is_residual = [True if big else next(it) for big in too_big]
        merged: dict[tuple[int, ...], np.ndarray] = {}
        residuals: list[Residual] = []
        for k, scope in enumerate(self._scopes):
            if is_residual[k]:
                self._tables.append(None)
                residuals.append(Residual(scope, self._residual_check(k)))
                continue
            table = self._truth_table(k)
            self._tables.append(table)
            if not table.any():
                self._constant_false.append(k)
            merged[scope] = table if scope not in merged else (merged[scope] & table)
        self._residual_flags = is_residual
        self._solver = Solver(sizes, [Factor(s, t) for s, t in merged.items()], residuals)

    def _residual_check(self, k: int):
        return lambda cols, n: self._evaluate(k, cols, n)

    def _check_not_empty(self) -> None:
        if self._exists():
            return
        if self._constant_false:
            k = self._constant_false[0]
            c = self.constraints[k]
            if c.names:
                raise SpaceError(c.field, f"no value of {', '.join(c.names)} satisfies {c.text!r}: "
                                          "no valid configuration is left")
            device = self.device.name if self.device is not None else "the device"
            raise SpaceError(c.field, f"{device} does not satisfy {c.text!r}: no valid configuration is left")
        # Find the first constraint that, added to those before it, empties the space.
        for k in range(1, len(self.constraints) + 1):
            sub = SearchSpace(self.parameters, self.constraints[:k], self.device, check_not_empty=False)
            if not sub._exists():
                c = self.constraints[k - 1]
                before = f" together with constraints[0..{k - 2}]" if k > 1 else ""
                raise SpaceError(c.field, f"{c.text!r}{before} leaves no valid configuration") from None
        raise SpaceError("constraints", "the constraints leave no valid configuration")

    def _exists(self) -> bool:
        if self._solver.superset_count == 0:
            return False
        if not self._solver.residuals:
            return True
        return next(iter(self._solver.iter_blocks()), None) is not None

    def __reduce__(self):
        # Constraints are compiled closures; rebuild from the spec on the other side (executors).
        return (_rebuild, ([p.spec for p in self.parameters], [c.text for c in self.constraints], self.device))

    def __repr__(self) -> str:
        return (f"SearchSpace({len(self.parameters)} parameters, {len(self.constraints)} constraints, "
                f"cartesian {self.cartesian_size})")

    # ---------------------------------------------------------------------------------------
    # size, enumeration, sampling

    @property
    def cartesian_size(self) -> int:
        return math.prod(self.sizes)

    @property
    def residual_constraints(self) -> tuple[Constraint, ...]:
        """Constraints too wide for a table; checked by filtering (slower count, rejection sampling)."""
        return tuple(c for c, r in zip(self.constraints, self._residual_flags, strict=True) if r)

    @cached_property
    def _count(self) -> int:
        return self._solver.count()

    def count(self) -> int:
        """Exact number of valid configurations."""
        return self._count

    def _rows_from_cols(self, cols: Mapping[int, np.ndarray], n: int) -> np.ndarray:
        out = np.empty((n, len(self.sizes)), dtype=np.int32)
        for j in range(len(self.sizes)):
            out[:, j] = cols[j]
        return out

    def enumerate(self, limit: int | None = None, dtype: Any = np.int32) -> np.ndarray:
        """All valid configurations as index rows (at most ``limit``), in a fixed order.

        ``dtype``: an integer type for the rows, e.g. ``np.uint8`` when no parameter has
        more than 256 values (a quarter of int32's memory for a large space)."""
        d = len(self.sizes)
        dtype = np.dtype(dtype)
        if dtype.kind not in "iu" or (self.sizes and max(self.sizes) - 1 > np.iinfo(dtype).max):
            raise SpaceError("enumerate", f"{dtype} cannot hold the value indices of this space")
        if limit is not None and limit <= 0:
            return np.zeros((0, d), dtype=dtype)
        # Unconstrained parameters are a plain Cartesian factor: enumerate the constrained core
        # and write the free columns once per output block instead of carrying them through
        # every expansion step.
        free: list[int] = []
        for j in sorted(self._solver.free_vars, key=lambda j: self.sizes[j]):
            if math.prod(self.sizes[k] for k in free) * self.sizes[j] <= _MAX_PATTERN:
                free.append(j)
        free.sort()
        fsizes = [self.sizes[j] for j in free]
        nfree = math.prod(fsizes)
        pattern = np.indices(fsizes).reshape(len(free), -1).T.astype(np.int32) if free else None
        known = self._count if not self._solver.residuals or "_count" in self.__dict__ else None
        cap = (known if limit is None else min(known, limit)) if known is not None else limit
        if cap is not None and cap * d * 4 > MAX_ENUMERATE_BYTES:
            raise SpaceError("enumerate", f"{cap} valid configurations are too many to hold in memory; "
                                          "pass limit= or use sample()")
        blocks: list[np.ndarray] = []
        out = np.empty((cap, d), dtype=dtype) if cap is not None else None
        pos = 0
        core_chunk = max(1, CHUNK_ROWS // nfree)
        for cols, m in self._solver.iter_blocks(chunk=core_chunk, skip=free):
            take = m * nfree
            if cap is not None:
                take = min(take, cap - pos)
            block = out[pos: pos + take] if out is not None else np.empty((take, d), dtype=dtype)
            # Fill in cache-sized slabs: column writes into a row-major array are strided, and
            # doing them slab by slab keeps the rows in cache.
            for s0 in range(0, take, _SLAB):
                s1 = min(take, s0 + _SLAB)
                slab = block[s0:s1]
                at = np.arange(s0, s1)
                core_at = at // nfree if nfree > 1 else at
                for j, c in cols.items():
                    slab[:, j] = c[core_at]
                if pattern is not None:
                    slab[:, free] = pattern[at % nfree]
            if out is None:
                blocks.append(block)
            pos += take
            if pos * d * 4 > MAX_ENUMERATE_BYTES:
                raise SpaceError("enumerate", "too many valid configurations to hold in memory; pass limit= "
                                              "or use sample()")
            if cap is not None and pos >= cap:
                break
        if out is not None:
            return out[:pos]
        return np.concatenate(blocks) if blocks else np.zeros((0, d), dtype=dtype)

    def _draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` independent uniform draws (with replacement) from the valid configurations."""
        solver = self._solver
        if not solver.residuals:
            return self._rows_from_cols(solver.sample_superset(n, rng), n)
        parts: list[np.ndarray] = []
        got = proposed = 0
        accept = 0.5
        while got < n:
            batch = int(min(1 << 20, max(1024, (n - got) / max(accept, 1e-6) * 1.2)))
            cols = solver.sample_superset(batch, rng)
            ok = solver.residual_ok(cols, batch)
            proposed += batch
            rows = self._rows_from_cols(cols, batch)[ok]
            parts.append(rows)
            got += rows.shape[0]
            accept = max(got / proposed, 1.0 / proposed)
            if got == 0 and proposed >= 4 << 20:
                # Rejection is hopeless here: draw from the enumerated valid set instead.
                valid = self.enumerate()
                return valid[rng.integers(0, valid.shape[0], size=n)]
        return np.concatenate(parts)[:n]

    def sample(self, n: int, rng: np.random.Generator | None = None, distinct: bool = True) -> np.ndarray:
        """``n`` uniformly random valid index rows; distinct ones unless ``distinct=False``.

        With ``distinct=True`` at most ``count()`` rows come back (all of them, shuffled, when n
        is larger).
        """
        rng = np.random.default_rng() if rng is None else rng
        d = len(self.sizes)
        if n <= 0:
            return np.zeros((0, d), dtype=np.int32)
        if not distinct:
            return self._draw(n, rng)
        total = self._count if not self._solver.residuals or "_count" in self.__dict__ else None
        if total is not None and (n >= total or (total <= 4 * n and total <= 1 << 22)):
            valid = self.enumerate()
            return valid[rng.permutation(valid.shape[0])[:n]]
        keys_seen: set[bytes] = set()
        out: list[np.ndarray] = []
        got = 0
        rounds = 0
        while got < n:
            rows = self._draw(int((n - got) * 1.1) + 8, rng)
            # Drawing i.i.d. and dropping repeats yields a uniformly random n-subset.
            for row in rows:
                key = row.tobytes()
                if key not in keys_seen:
                    keys_seen.add(key)
                    out.append(row)
                    got += 1
                    if got == n:
                        break
            rounds += 1
            if rounds > 50 and got < n:  # far more asked than exist distinct: take what there is
                valid = self.enumerate()
                return valid[rng.permutation(valid.shape[0])[:n]]
        return np.stack(out).astype(np.int32)

    # ---------------------------------------------------------------------------------------
    # validity and conversions

    def _as_rows(self, rows: Any) -> np.ndarray:
        arr = np.asarray(rows)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != len(self.sizes):
            raise SpaceError("rows", f"expected index rows of width {len(self.sizes)}, got shape {np.shape(rows)}")
        if arr.size and arr.dtype.kind not in "iu":
            raise SpaceError("rows", f"index rows must be integers, got {arr.dtype}")
        return arr

    def is_valid(self, rows: Any) -> np.ndarray:
        """Boolean per row: indices in range and every constraint satisfied."""
        arr = self._as_rows(rows)
        n = arr.shape[0]
        ok = np.ones(n, dtype=bool)
        for j, size in enumerate(self.sizes):
            ok &= (arr[:, j] >= 0) & (arr[:, j] < size)
        safe = np.where(ok[:, None], arr, 0)
        for k, scope in enumerate(self._scopes):
            table = self._tables[k]
            if table is not None:
                ok &= table[tuple(safe[:, j] for j in scope)] if scope else bool(table)
            else:
                ok &= self._evaluate(k, {j: safe[:, j] for j in scope}, n)
        return ok

    def to_configs(self, rows: Any) -> list[dict[str, Any]]:
        arr = self._as_rows(rows)
        for j, size in enumerate(self.sizes):
            col = arr[:, j]
            if col.size and (col.min() < 0 or col.max() >= size):
                raise SpaceError("rows", f"index out of range for parameter {self.names[j]!r} "
                                         f"(it has {size} values)")
        columns = [[p.plain(p.values[i]) for i in arr[:, j].tolist()] for j, p in enumerate(self.parameters)]
        return [dict(zip(self.names, vals, strict=True)) for vals in zip(*columns, strict=True)] if columns else []

    def to_rows(self, configs: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """Index rows of configurations given as name → value; `SpaceError` if one is not in the space."""
        configs = list(configs)
        names = set(self._index)
        for i, config in enumerate(configs):
            if not isinstance(config, Mapping):
                raise SpaceError(f"configs[{i}]", f"expected a mapping of parameter name to value, got "
                                                  f"{type(config).__name__}")
            if config.keys() != names:
                extra = set(config) - names
                if extra:
                    raise SpaceError(f"configs[{i}]", f"unknown parameter {sorted(map(str, extra))[0]!r}")
                missing = [n for n in self.names if n not in config]
                raise SpaceError(f"configs[{i}]", f"missing parameter {missing[0]!r}")
        out = np.empty((len(configs), len(self.sizes)), dtype=np.int32)
        for j, p in enumerate(self.parameters):
            lookup = p.lookup
            # Numbers look themselves up directly (value_key of a number is the number); anything
            # else, and misses, go through index_of for the type-aware rules.
            direct = p.kind == "numeric"
            for i, config in enumerate(configs):
                v = config[p.name]
                idx = lookup.get(v) if direct and type(v) in (int, float) else None
                if idx is None:
                    idx = p.index_of(v)
                    if idx is None:
                        raise SpaceError(f"configs[{i}].{p.name}", f"{v!r} is not a value of {p.name!r}")
                out[i, j] = idx
        return out

    def key(self, config_or_row: Any) -> str:
        """Stable string key: the values joined by "," in parameter order (Kernel Tuner's cache key)."""
        if isinstance(config_or_row, Mapping):
            row = self.to_rows([config_or_row])[0]
        else:
            row = self._as_rows(config_or_row)[0]
        parts = []
        for j, p in enumerate(self.parameters):
            if not 0 <= row[j] < self.sizes[j]:
                raise SpaceError("rows", f"index out of range for parameter {p.name!r}")
            v = p.values[int(row[j])]
            parts.append("(" + " ".join(map(str, v)) + ")" if p.type == "permutation" else str(v))
        return ",".join(parts)

    def default_row(self) -> np.ndarray | None:
        """The parameters' defaults as an index row, if every parameter has one and the row is valid."""
        if not all(p.has_default for p in self.parameters):
            return None
        row = np.array([p.index_of(p.default) for p in self.parameters], dtype=np.int32)
        return row if bool(self.is_valid(row)[0]) else None

    # ---------------------------------------------------------------------------------------
    # models

    @cached_property
    def _encoding(self) -> Encoding:
        return build_encoding(self.parameters)

    def encode(self, rows: Any) -> np.ndarray:
        """float64 features in [0, 1]; column groups in `feature_groups`."""
        arr = self._as_rows(rows)
        return self._encoding.encode(arr)

    @property
    def feature_groups(self) -> list[tuple[str, slice]]:
        return list(self._encoding.groups)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self._encoding.names

    def neighbours(self, row: Any) -> np.ndarray:
        """Valid rows one move away: the adjacent value of a numeric parameter, any other value of
        a categorical/boolean one, or a swap of two items of a permutation."""
        base = self._as_rows(row)[0].astype(np.int32)
        candidates: list[np.ndarray] = []
        for j, p in enumerate(self.parameters):
            cur = int(base[j])
            if p.kind == "numeric":
                order = p.sorted_order
                rank = int(np.flatnonzero(order == cur)[0])
                alts = [int(order[r]) for r in (rank - 1, rank + 1) if 0 <= r < len(order)]
            elif p.kind == "permutation":
                perm = list(p.values[cur])
                alts = []
                for a in range(len(perm)):
                    for b in range(a + 1, len(perm)):
                        swapped = perm.copy()
                        swapped[a], swapped[b] = swapped[b], swapped[a]
                        alts.append(p.lookup[tuple(swapped)])
            else:
                alts = [i for i in range(len(p.values)) if i != cur]
            for a in alts:
                cand = base.copy()
                cand[j] = a
                candidates.append(cand)
        if not candidates:
            return np.zeros((0, len(self.sizes)), dtype=np.int32)
        cands = np.stack(candidates)
        return cands[self.is_valid(cands)]


def _rebuild(parameters: list[dict[str, Any]], constraints: list[str], device: DeviceLimits | None) -> SearchSpace:
    return SearchSpace.from_spec(parameters, constraints, device)
