"""`SearchSpace`: typed parameters + known constraints (+ the target's device limits).

The one object the operator, the optimiser and the tools hold for a space: built from the
spec (`SearchSpace.from_spec`), it answers how many configurations are valid, enumerates and
samples them, checks and converts rows, and gives the optimiser its features and neighbours.

A configuration is handled as an *index row*: one int32 per parameter, the position of its
value in that parameter's value list (``space.parameters[j].values``). Rows are what the
optimiser stores and models; `to_configs` turns them into plain values for Jobs and results.
The parts live beside it: the compiled constraints and the check that some configuration is
left in `fleettune.space.constraints`, row conversions and keys in `fleettune.space.rows`,
model features in `fleettune.space.encode`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from fleettune.space import rows as rowlib
from fleettune.space.constraints import ConstraintSet
from fleettune.space.devices import DeviceLimits
from fleettune.space.encode import Encoding, build_encoding
from fleettune.space.enumeration import CHUNK_ROWS
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
        self._compiled = ConstraintSet(self.parameters, self.constraints)
        self._solver = self._compiled.solver
        if check_not_empty:
            self._compiled.check_not_empty(device)

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
        return tuple(c for c, r in zip(self.constraints, self._compiled.residual_flags, strict=True) if r)

    @cached_property
    def _count(self) -> int:
        return self._solver.count()

    def count(self) -> int:
        """Exact number of valid configurations."""
        return self._count

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
            return rowlib.rows_from_cols(solver.sample_superset(n, rng), n, len(self.sizes))
        parts: list[np.ndarray] = []
        got = proposed = 0
        accept = 0.5
        while got < n:
            batch = int(min(1 << 20, max(1024, (n - got) / max(accept, 1e-6) * 1.2)))
            cols = solver.sample_superset(batch, rng)
            ok = solver.residual_ok(cols, batch)
            proposed += batch
            rows = rowlib.rows_from_cols(cols, batch, len(self.sizes))[ok]
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
        return rowlib.as_rows(rows, len(self.sizes))

    def is_valid(self, rows: Any) -> np.ndarray:
        """Boolean per row: indices in range and every constraint satisfied."""
        arr = self._as_rows(rows)
        ok = np.ones(arr.shape[0], dtype=bool)
        for j, size in enumerate(self.sizes):
            ok &= (arr[:, j] >= 0) & (arr[:, j] < size)
        safe = np.where(ok[:, None], arr, 0)
        return ok & self._compiled.satisfied(safe)

    def to_configs(self, rows: Any) -> list[dict[str, Any]]:
        return rowlib.to_configs(self.parameters, self._as_rows(rows))

    def to_rows(self, configs: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """Index rows of configurations given as name → value; `SpaceError` if one is not in the space."""
        return rowlib.to_rows(self.parameters, configs)

    def key(self, config_or_row: Any) -> str:
        """Stable string key: the values joined by "," in parameter order (Kernel Tuner's cache key)."""
        if isinstance(config_or_row, Mapping):
            row = self.to_rows([config_or_row])[0]
        else:
            row = self._as_rows(config_or_row)[0]
        return rowlib.row_key(self.parameters, row)

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

    def neighbours(self, row: Any) -> np.ndarray:
        """Valid rows one move away: the adjacent value of a numeric parameter, any other value of
        a categorical/boolean one, or a swap of two items of a permutation."""
        cands = rowlib.neighbour_candidates(self.parameters, self._as_rows(row)[0].astype(np.int32))
        return cands[self.is_valid(cands)] if len(cands) else cands


def _rebuild(parameters: list[dict[str, Any]], constraints: list[str], device: DeviceLimits | None) -> SearchSpace:
    return SearchSpace.from_spec(parameters, constraints, device)
