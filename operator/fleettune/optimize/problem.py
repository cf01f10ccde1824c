"""What a strategy sees: the candidate set, its encoding, and the history so far.

Everything here is plain numpy, indexed by candidate number, so that strategies can be
tested without a search-space object and replayed without a cluster.

Memory: a study may hold up to 2 million candidates (see ``study.MAX_ENUMERATED``). Their
index rows are kept in the narrowest unsigned type that holds them (one byte per parameter
for up to 256 values), their features are computed from the rows when asked for (see
`LazyFeatures`) unless the matrix is small, and the lookup keys' order is int32 (or none
at all when the rows come sorted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fleettune_job.protocol import Outcome

# Feature matrices up to this size are built once and kept: scoring every candidate of a
# small space (up to `max_pool`) reads them whole at each suggestion. Larger candidate sets
# are only ever scored in subsets, whose features are computed when asked for.
MATERIALISE_BYTES = 16 << 20


class FeatureFunction(Protocol):
    """Features of index rows (see `features.FeatureMap`)."""

    width: int
    feasibility_width: int

    def __call__(self, rows: np.ndarray, feas: bool = False) -> np.ndarray: ...

    def odd_parts(self, rows: np.ndarray) -> np.ndarray: ...


class LazyFeatures:
    """A read-only (N, f) float64 feature matrix that is not stored: indexing it (``x[i]``,
    ``x[idx]``, ``x[a:b]``, ``x[idx, cols]``) computes the features of those rows, exactly
    the values the materialised matrix would hold."""

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, rows: np.ndarray, compute: Callable[[np.ndarray], np.ndarray], width: int) -> None:
        self._rows = rows
        self._compute = compute
        self.shape = (int(rows.shape[0]), int(width))

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        """What the materialised matrix would take (nothing is stored)."""
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, tuple):
            sub = self[key[0]]
            return sub[key[1:]] if sub.ndim == 1 else sub[(slice(None), *key[1:])]
        if isinstance(key, (int, np.integer)):
            return self._compute(self._rows[[int(key)]])[0]
        return self._compute(self._rows[key].reshape(-1, self._rows.shape[1]))

    def materialise(self) -> np.ndarray:
        return self._compute(self._rows)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.materialise()
        return out if dtype is None else out.astype(dtype, copy=False)


def index_dtype(rows: np.ndarray) -> np.dtype:
    """The narrowest type for index rows: uint8 up to 256 values per parameter, uint16 up to
    65 536, int32 beyond (or if a row holds a negative index)."""
    if rows.size == 0 or int(rows.min()) < 0:
        return np.dtype(np.int32)
    top = int(rows.max())
    return np.dtype(np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else np.int32)


Matrix = np.ndarray | LazyFeatures  # an (N, f) feature matrix, stored or computed when indexed


class Candidates:
    """The finite set a study chooses from: index rows and their feature encoding.

    ``x``/``xf`` are arrays, or None with ``features`` given: then they are computed from
    the rows (kept as arrays up to ``MATERIALISE_BYTES``, `LazyFeatures` beyond). ``rows``
    are stored in the narrowest type that holds them (`index_dtype`); read-only, so that
    studies of the same space can share one ``Candidates``.
    """

    rows: np.ndarray  # (N, d) value indices
    x: Matrix  # (N, f) encoding in [0, 1]
    xf: Matrix  # (N, f') inputs of the feasibility model; default: x
    feature_groups: list[tuple[str, slice]]
    switches: tuple[int, ...]  # row columns that choose a code path (features.switches)
    features: FeatureFunction | None

    def __init__(
        self,
        rows: np.ndarray,
        x: Matrix | None = None,
        feature_groups: list[tuple[str, slice]] | None = None,
        xf: Matrix | None = None,
        switches: tuple[int, ...] = (),
        features: FeatureFunction | None = None,
    ) -> None:
        self.feature_groups = list(feature_groups or [])
        self.switches = tuple(switches)
        self.features = features
        self._order: np.ndarray | None = None
        self._bytes: np.dtype | None = None  # set when the keys are the rows' bytes
        rows = np.asarray(rows)
        self.rows = np.ascontiguousarray(rows, dtype=index_dtype(rows)).view()
        self.rows.flags.writeable = False  # (on this view only: the caller's array stays as it was)
        if x is None:
            if features is None:
                raise ValueError("candidates need an encoding: x, or features to compute it from")
            x = self._features(feas=False)
            if xf is None:
                xf = self._features(feas=True)
        self.x = x
        if self.rows.ndim != 2 or self.x.shape[0] != self.rows.shape[0]:
            raise ValueError("candidate rows and encoding must have the same number of rows")
        if len(self.rows) == 0:
            raise ValueError("empty candidate set")
        self.xf = x if xf is None else xf
        radix = (self.rows.max(axis=0).astype(np.int64) + 1) if len(self.rows) else np.ones(0, np.int64)
        # Mixed-radix integer keys make lookup a vectorised binary search; in spaces whose
        # unrestricted product overflows int64, each row's bytes are its key.
        self._radix: np.ndarray = radix
        if float(np.prod(radix.astype(float))) >= 2.0**62:
            self._bytes = np.dtype((np.void, self.rows.shape[1] * self.rows.itemsize))
        keys = self._encode_keys(self.rows)
        if self._bytes is None and len(keys) > 1 and bool((keys[1:] > keys[:-1]).all()):
            self._keys: np.ndarray = keys  # already in order: no permutation to keep
        else:
            order = np.argsort(keys, kind="stable")
            self._keys = keys[order]
            self._order = order.astype(np.int32) if len(order) < 2**31 else order

    def __repr__(self) -> str:
        return f"Candidates({len(self)} rows, {self.n_features} features)"

    def _features(self, feas: bool) -> Matrix:
        fn = self.features
        assert fn is not None
        width = fn.feasibility_width if feas else fn.width
        lazy = LazyFeatures(self.rows, lambda rows: fn(rows, feas=feas), width)
        return lazy.materialise() if lazy.nbytes <= MATERIALISE_BYTES else lazy

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.x.shape[1])

    def _encode_keys(self, rows: np.ndarray) -> np.ndarray:
        if self._bytes is not None:  # (rows within the radix: they fit the stored type)
            return np.ascontiguousarray(rows, dtype=self.rows.dtype).view(self._bytes).reshape(-1)
        keys = np.zeros(len(rows), dtype=np.int64)
        for j, r in enumerate(self._radix):
            keys = keys * r + rows[:, j].astype(np.int64)
        return keys

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """Candidate number of each row, -1 where the row is not a candidate."""
        rows = np.asarray(rows, dtype=np.int32).reshape(-1, self.rows.shape[1])
        inside = np.all((rows >= 0) & (rows < self._radix), axis=1)
        out = np.full(len(rows), -1, dtype=np.int64)
        if inside.any():
            keys = self._encode_keys(rows[inside])
            pos = np.searchsorted(self._keys, keys).clip(max=len(self._keys) - 1)
            hit = self._keys[pos] == keys
            out[np.flatnonzero(inside)[hit]] = pos[hit] if self._order is None else self._order[pos[hit]]
        return out

    def hamming_neighbours(self, rows: np.ndarray, *, chunk: int = 131_072) -> np.ndarray:
        """Candidates (sorted numbers) that differ from any of ``rows`` in exactly one
        parameter: the one-move neighbourhoods a local search walks through. The moves
        are generated and looked up (restricted spaces need no neighbour generator:
        moves that are not candidates are dropped); when there would be more moves than
        candidates, one vectorised scan finds them instead."""
        rows = np.asarray(rows, dtype=np.int32).reshape(-1, self.rows.shape[1])
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64)
        radix = self._radix
        moves = _moves(rows, radix, limit=len(self.rows))
        if moves is not None:
            found = self.lookup(moves)
            return np.unique(found[found >= 0])
        out = []
        for s in range(0, len(self.rows), chunk):
            part = self.rows[s : s + chunk]
            diff = np.zeros((len(part), len(rows)), dtype=np.int16)
            for j in range(part.shape[1]):  # column by column: no (chunk, k, d) temporary
                diff += part[:, j : j + 1] != rows[None, :, j]
            out.append(np.flatnonzero((diff == 1).any(axis=1)) + s)
        return np.concatenate(out)


def _moves(rows: np.ndarray, radix: np.ndarray, limit: int) -> np.ndarray | None:
    """Every index row that changes one parameter of one of ``rows``, or None when there
    would be more than ``limit`` of them."""
    if len(rows) * int((radix - 1).sum()) > limit:
        return None
    out = []
    for j, r in enumerate(int(r) for r in radix):
        m = np.repeat(rows, r, axis=0)
        m[:, j] = np.tile(np.arange(r), len(rows))
        out.append(m[m[:, j] != np.repeat(rows[:, j], r)])
    return np.concatenate(out).astype(np.int32)


@dataclass
class History:
    """Observations in arrival order. ``task`` 0 marks warm-start data from elsewhere."""

    x: np.ndarray  # (m, f)
    xf: np.ndarray  # (m, f') feasibility-model inputs
    cand: np.ndarray  # (m,) candidate number or -1
    value: np.ndarray  # (m,) objective (ms), nan when the configuration failed
    noise: np.ndarray  # (m,) variance of log(value) estimated from repeats (0 if unknown)
    outcome: list[Outcome]
    task: np.ndarray  # (m,) 1 = this study, 0 = prior

    @staticmethod
    def empty(n_features: int, n_feas_features: int) -> History:
        return History(
            x=np.zeros((0, n_features)),
            xf=np.zeros((0, n_feas_features)),
            cand=np.zeros(0, dtype=np.int64),
            value=np.zeros(0),
            noise=np.zeros(0),
            outcome=[],
            task=np.zeros(0, dtype=np.int8),
        )

    def __len__(self) -> int:
        return len(self.outcome)

    @property
    def feasible(self) -> np.ndarray:
        return np.isfinite(self.value)

    def prefix(self, m: int) -> History:
        return self._take(slice(None, m))

    def without_prior(self) -> History:
        """This study's own observations only."""
        return self._take(np.flatnonzero(self.task == 1))

    def own_values(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows of this study's own observations, and their values (failures: +inf)."""
        rows = np.flatnonzero(self.task == 1)
        return rows, np.where(self.feasible[rows], self.value[rows], np.inf)

    def _take(self, sel: slice | np.ndarray) -> History:
        return History(
            x=self.x[sel],
            xf=self.xf[sel],
            cand=self.cand[sel],
            value=self.value[sel],
            noise=self.noise[sel],
            outcome=self.outcome[sel] if isinstance(sel, slice) else [self.outcome[i] for i in sel],
            task=self.task[sel],
        )

    def append(
        self, x: np.ndarray, xf: np.ndarray, cand: int, value: float, noise: float, outcome: Outcome, task: int
    ) -> None:
        self.x = np.vstack([self.x, x.reshape(1, -1)])
        self.xf = np.vstack([self.xf, xf.reshape(1, -1)])
        self.cand = np.append(self.cand, cand)
        self.value = np.append(self.value, value)
        self.noise = np.append(self.noise, noise)
        self.outcome.append(outcome)
        self.task = np.append(self.task, np.int8(task))
