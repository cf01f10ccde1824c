"""Exact counting, enumeration and uniform sampling of valid configurations.

Each constraint becomes a 0/1 table over the parameters it names (its "scope"; the table is
the constraint evaluated once on the Cartesian product of just those parameters). Counting the
valid configurations is then a sum over a product of such tables, which *bucket elimination*
computes one parameter at a time: the tables that mention the parameter are multiplied into a
"bucket", and the parameter is summed out, leaving a message (a count table) over the
remaining parameters of the bucket. Cost and memory depend on the largest bucket, not on the
size of the space; independent groups of parameters (chain-of-trees) never meet in a bucket.

The buckets kept from that pass answer the two other questions without the Cartesian product:

* enumeration walks the parameters in reverse elimination order and extends each partial row
  only by values whose bucket count is positive. Every partial row therefore has at least one
  valid completion (no dead ends), so no intermediate table is larger than the result; blocks
  are expanded depth-first in bounded chunks, which also makes ``limit`` cheap.
* uniform sampling draws the parameters in the same order, each from its bucket row given the
  values already drawn; the bucket holds the number of valid completions of each choice, so
  every valid configuration is drawn with the same probability.

A constraint whose own table or bucket would be too large (e.g. one expression over many
wide parameters) is a *residual*: it is pushed down in enumeration (checked as soon as its
parameters are bound) and used to reject draws from the superset in sampling (uniform over a
superset, restricted by rejection, is uniform over the subset).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

TRUTH_TABLE_LIMIT = 1 << 22  # entries of one constraint table (evaluated in chunks)
BUCKET_LIMIT = 1 << 22  # entries of one elimination bucket
CHUNK_ROWS = 1 << 20  # rows per block while enumerating
SAMPLE_CHUNK = 1 << 16


@dataclass(frozen=True)
class Factor:
    scope: tuple[int, ...]  # variable ids, ascending
    table: np.ndarray  # shape == tuple(sizes[v] for v in scope); bool or counts


@dataclass(frozen=True)
class Residual:
    scope: tuple[int, ...]
    check: Callable[[dict[int, np.ndarray], int], np.ndarray]  # (index columns by variable, n) -> bool


def index_dtype(size: int) -> np.dtype:
    if size <= 256:
        return np.dtype(np.uint8)
    if size <= 65536:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def plan_elimination(sizes: Sequence[int], scopes: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """Greedy elimination order (smallest bucket first) and the size of its largest bucket."""
    pool = [frozenset(s) for s in scopes if s]
    remaining = set(range(len(sizes)))
    order: list[int] = []
    largest = 1
    while remaining:
        best: tuple[int, int, int] | None = None
        best_union: frozenset[int] = frozenset()
        for v in remaining:
            union = frozenset().union(*(s for s in pool if v in s)) | {v}
            key = (math.prod(sizes[u] for u in union), len(union), v)
            if best is None or key < best:
                best, best_union = key, union
        assert best is not None
        v = best[2]
        order.append(v)
        remaining.discard(v)
        largest = max(largest, best[0])
        rest = best_union - {v}
        pool = [s for s in pool if v not in s]
        if rest:
            pool.append(rest)
    return order, largest


def choose_residuals(sizes: Sequence[int], scopes: Sequence[Sequence[int]], limit: int | None = None) -> list[bool]:
    """Which scopes to leave out of elimination (True = residual) so no bucket exceeds ``limit``.

    Small scopes are admitted first: they prune most per entry and rarely widen buckets.
    """
    limit = BUCKET_LIMIT if limit is None else limit
    residual = [True] * len(scopes)
    admitted: list[Sequence[int]] = []
    for i in sorted(range(len(scopes)), key=lambda i: (math.prod(sizes[v] for v in scopes[i]), i)):
        if math.prod(sizes[v] for v in scopes[i]) > limit:
            continue
        _, largest = plan_elimination(sizes, [*admitted, scopes[i]])
        if largest <= limit:
            admitted.append(scopes[i])
            residual[i] = False
    return residual


def _align(table: np.ndarray, scope: Sequence[int], axes: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """View ``table`` (over ``scope``) broadcastable against a table over ``axes``."""
    where = {a: i for i, a in enumerate(axes)}
    perm = sorted(range(len(scope)), key=lambda i: where[scope[i]])
    shape = [1] * len(axes)
    for s in scope:
        shape[where[s]] = sizes[s]
    return table.transpose(perm).reshape(shape)


class Solver:
    """Bucket elimination over index domains of ``sizes``; see the module docstring."""

    def __init__(self, sizes: Sequence[int], factors: Sequence[Factor], residuals: Sequence[Residual] = ()):
        self.sizes = list(sizes)
        self.nvars = len(sizes)
        self.residuals = list(residuals)
        # int64 counts are exact while the whole Cartesian product fits; beyond it use Python ints.
        self.count_dtype: type | np.dtype = np.int64 if math.prod(self.sizes) < 2**62 else object
        self.order, _ = plan_elimination(self.sizes, [f.scope for f in factors])
        self.levels = self.order[::-1]  # enumeration / sampling order
        self._position = {v: i for i, v in enumerate(self.levels)}
        # bucket[v] = (others, table over (*others, v)); others are all bound before v.
        self.buckets: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        # cut[k] = (scalar, factors) left after eliminating order[:k]: the count of completions of
        # a partial row over levels[:nvars-k] is scalar * prod(factor values at the row).
        self._cuts: list[tuple[int, list[tuple[tuple[int, ...], np.ndarray]]]] = []
        self.superset_count = self._eliminate(factors)
        self._weights: dict[int, np.ndarray] = {}
        self._factor_scopes = [f.scope for f in factors]
        self._residual_level = [max(self._position[v] for v in r.scope) if r.scope else 0 for r in self.residuals]
        # A residual is checked right after its last-bound variable is expanded (push-down).
        self._residuals_at: dict[int, list[Residual]] = {}
        for r, lvl in zip(self.residuals, self._residual_level, strict=True):
            self._residuals_at.setdefault(self.levels[lvl], []).append(r)

    # -- elimination ---------------------------------------------------------------------------
    def _eliminate(self, factors: Sequence[Factor]) -> int:
        dtype = self.count_dtype
        pool: list[tuple[tuple[int, ...], np.ndarray]] = [(f.scope, np.asarray(f.table).astype(dtype)) for f in factors]
        scalar = 1
        for f_scope, f_table in list(pool):
            if not f_scope:  # constant constraints (device-only) are a 0/1 scalar
                scalar *= int(f_table)
        pool = [p for p in pool if p[0]]
        for v in self.order:
            self._cuts.append((scalar, list(pool)))
            involved = [p for p in pool if v in p[0]]
            pool = [p for p in pool if v not in p[0]]
            others = tuple(sorted(set().union(*(s for s, _ in involved)) - {v})) if involved else ()
            axes = (*others, v)
            shape = tuple(self.sizes[a] for a in axes)
            table: np.ndarray | None = None
            for scope, t in involved:
                aligned = _align(t, scope, axes, self.sizes)
                table = aligned if table is None else table * aligned
            if table is None:
                table = np.ones(shape, dtype=dtype)
            table = np.ascontiguousarray(np.broadcast_to(table, shape))
            self.buckets[v] = (others, table)
            message = table.sum(axis=-1)
            if others:
                pool.append((others, message))
            else:
                scalar *= int(message)
        self._cuts.append((scalar, []))
        return int(scalar)

    # -- weights for a block of partial rows ---------------------------------------------------
    def _bucket_rows(self, v: int, cols: dict[int, np.ndarray], m: int, weights: bool = False) -> np.ndarray:
        others, table = self.buckets[v]
        if weights:
            cached = self._weights.get(v)
            if cached is None:
                cached = self._weights[v] = table.astype(np.float64)
            table = cached
        if not others:
            return np.broadcast_to(table, (m, table.shape[-1]))
        return table[tuple(cols[o] for o in others)]

    def _check_residuals(self, var: int, cols: dict[int, np.ndarray], m: int) -> np.ndarray | None:
        keep: np.ndarray | None = None
        for r in self._residuals_at.get(var, ()):
            ok = r.check(cols, m)
            keep = ok if keep is None else keep & ok
        return keep

    # -- enumeration ---------------------------------------------------------------------------
    @property
    def free_vars(self) -> list[int]:
        """Variables no constraint mentions: a plain Cartesian factor of the valid set."""
        bound = {v for f in self._factor_scopes for v in f} | {v for r in self.residuals for v in r.scope}
        return [v for v in range(self.nvars) if v not in bound]

    def iter_blocks(self, depth: int | None = None, chunk: int = CHUNK_ROWS,
                    skip: Sequence[int] = ()) -> Iterator[tuple[dict[int, np.ndarray], int]]:
        """Blocks of valid partial rows over ``levels[:depth]`` (all levels by default), in order.

        Variables in ``skip`` (free ones only) are left out; the caller multiplies them in.
        """
        levels = self.levels[: self.nvars if depth is None else depth]
        if skip:
            levels = [v for v in levels if v not in set(skip)]
        if self.superset_count == 0:
            return
        if not levels:
            yield {}, 1
            return
        yield from self._expand({}, 1, levels, 0, chunk)

    def _expand(self, cols: dict[int, np.ndarray], m: int, levels: list[int], level: int,
                chunk: int) -> Iterator[tuple[dict[int, np.ndarray], int]]:
        v = levels[level]
        mask = self._bucket_rows(v, cols, m) > 0
        rows, vals = np.nonzero(mask)
        new = {u: c[rows] for u, c in cols.items()}
        new[v] = vals.astype(index_dtype(self.sizes[v]))
        n = rows.size
        keep = self._check_residuals(v, new, n)
        if keep is not None:
            new = {u: c[keep] for u, c in new.items()}
            n = int(keep.sum())
        if n == 0:
            return
        if level + 1 == len(levels):
            yield new, n
            return
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            part = new if (start == 0 and stop == n) else {u: c[start:stop] for u, c in new.items()}
            yield from self._expand(part, stop - start, levels, level + 1, chunk)

    def count(self) -> int:
        """Exact number of valid configurations (residual constraints included)."""
        if not self.residuals or self.superset_count == 0:
            return self.superset_count
        depth = max(self._residual_level) + 1
        scalar, factors = self._cuts[self.nvars - depth]
        total = 0
        for cols, m in self.iter_blocks(depth):
            weight = np.ones(m, dtype=self.count_dtype)
            for scope, table in factors:
                weight = weight * table[tuple(cols[s] for s in scope)]
            total += int(weight.sum())
        return total * scalar

    # -- sampling ------------------------------------------------------------------------------
    def sample_superset(self, n: int, rng: np.random.Generator) -> dict[int, np.ndarray]:
        """``n`` independent uniform draws from the configurations valid for the non-residual constraints."""
        out: dict[int, list[np.ndarray]] = {v: [] for v in self.levels}
        for start in range(0, n, SAMPLE_CHUNK):
            m = min(SAMPLE_CHUNK, n - start)
            cols: dict[int, np.ndarray] = {}
            for v in self.levels:
                others, _ = self.buckets[v]
                w = self._bucket_rows(v, cols, m, weights=True)
                if not others:
                    cum = np.cumsum(w[0])
                    cols[v] = np.searchsorted(cum, rng.random(m) * cum[-1], side="right")
                else:
                    cum = np.cumsum(w, axis=1)
                    u = rng.random(m) * cum[:, -1]
                    cols[v] = (cum <= u[:, None]).sum(axis=1)
                np.minimum(cols[v], self.sizes[v] - 1, out=cols[v])  # guards the u == total float edge
            for v in self.levels:
                out[v].append(cols[v])
        return {v: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64) for v, parts in out.items()}

    def residual_ok(self, cols: dict[int, np.ndarray], n: int) -> np.ndarray:
        ok = np.ones(n, dtype=bool)
        for r in self.residuals:
            ok &= r.check(cols, n)
        return ok
