"""Model inputs built from the space's type-aware encoding.

* categorical codes (i/(k-1) in the space's encoding, meaningful only as same/different)
  become one-hot columns scaled by 1/sqrt(2), so that a Euclidean kernel sees a
  Hamming distance of 1 per changed category, never an order;
* the feasibility model additionally gets linear positive size-like parameters on a
  log scale: GPU resource limits are products of sizes (threads = bx*by, registers ~
  block x tile), and a product threshold is a straight boundary in log coordinates;
* integer sizes that reach a warp (32) whose values are not all powers of two get a
  second objective column, the value's power-of-two divisibility (see `alignment`);
* the slow-regime classifier (``BayesOptions.slow_ratio``) sees the feasibility inputs
  plus, for positive integer sizes that are not all powers of two, their odd part (see
  `odd_part`), which the objective's GP does not get;
* numeric and permutation columns are used as the space encodes them.
"""

from __future__ import annotations

import numpy as np

from fleettune.space import SearchSpace
from fleettune.space.encode import permutation_table

LOG_RATIO = 4.0  # max/min above which a positive linear parameter also counts on a log scale
WARP = 32  # sizes that reach a warp get a divisibility column (see `alignment`)


def _normalise(v: np.ndarray) -> np.ndarray:
    lo, hi = float(v.min()), float(v.max())
    return np.zeros_like(v) if hi <= lo else (v - lo) / (hi - lo)


def alignment(values: np.ndarray) -> np.ndarray | None:
    """The largest power of two dividing each value, on a normalised log scale, for
    sizes that reach a warp; None where it would say nothing new (not positive
    integers, all powers of two, or all equally divisible) or for small factors.

    GPU kernel times jump with divisibility: warps of 32, memory transactions of 32 to
    128 bytes, and a problem size (usually a power of two) that a block x tile divides
    evenly or leaves a ragged, half-idle last block. In a smooth kernel over the value,
    48 sits between 32 and 64 and must behave like them; with this column it can be
    told apart from both. Small factors (tiles of 1..8) change the work per thread
    smoothly; there the column is noise the model must first learn to ignore, so they
    get none (measurements: docs/decisions.md).
    """
    div = _divisors(values) if values.max() >= WARP else None
    if div is None:
        return None
    twos = np.log2(div)
    return None if twos.max() <= twos.min() else _normalise(twos)


def odd_part(values: np.ndarray) -> np.ndarray | None:
    """The log of each value's odd part (what is left once every factor of two is
    divided out: 0 for 1, 2, 4, 8, ...), normalised; None where it would say nothing
    (not positive integers, all powers of two, or all the same).

    On AMD GPUs a tile of 3 or a block width of 48 or 96 runs 30-100 times slower than
    its power-of-two neighbours, while on NVIDIA GPUs the same sizes are ordinary (on
    convolution_milo-A100 the optimum has a tile of 3). As an objective column it cost
    the NVIDIA recordings more than it gave the AMD ones (measured, not kept), so only
    the slow-regime classifier gets it.
    """
    div = _divisors(values)
    if div is None:
        return None
    odd = np.log2(values / div)
    return None if odd.max() <= odd.min() else _normalise(odd)


def _divisors(values: np.ndarray) -> np.ndarray | None:
    """The largest power of two dividing each value (float64), for positive integers
    that are not all powers of two (where the log of the value already says it); else
    None."""
    if not np.all((values == np.round(values)) & (values > 0)):
        return None
    ints = values.astype(np.int64)
    if np.all((ints & (ints - 1)) == 0):
        return None
    return (ints & -ints).astype(np.float64)


def switches(space: SearchSpace) -> tuple[int, ...]:
    """Parameters that choose a code path rather than a size: booleans, categoricals
    and 0/1 integers (how Kernel Tuner spaces spell a flag such as ``use_shmem``).

    A new GPU or driver often changes which code path wins (shared memory or the
    read-only cache, staging A in shared memory or not); a warm start probes the other
    paths (see ``BayesOpt._path_probes``)."""
    out = []
    for j, p in enumerate(space.parameters):
        if len(p.values) < 2 or p.kind == "permutation":
            continue
        if p.kind == "categorical" or p.type == "boolean" or sorted(p.values) == [0, 1]:
            out.append(j)
    return tuple(out)


class FeatureMap:
    """Model features as per-parameter lookup tables: every feature column is a function
    of one parameter's value, so the features of any rows are ``table[rows[:, j]]`` per
    parameter, built exactly (same float64 values) for just the rows asked for.

    A study of 10^6 candidates needs features for the tens of thousands it scores per
    suggestion, not a (10^6, f) matrix per model (hundreds of MiB per study).
    """

    def __init__(self, space: SearchSpace) -> None:
        params = space.parameters
        if not params:
            raise ValueError("features from tables need a space with parameters")
        self.objective: list[tuple[int, np.ndarray]] = []  # (parameter, (k, w) table)
        self.feasibility: list[tuple[int, np.ndarray]] = []
        self.groups: list[tuple[str, slice]] = []
        self.odd: list[tuple[int, np.ndarray]] = []  # (parameter, (k,) table): `odd_part` columns
        width = 0
        for kind in ("numeric", "categorical"):
            for j, p in enumerate(params):
                if p.kind != kind:
                    continue
                if kind == "numeric":
                    vals = np.asarray(p.values, dtype=np.float64)
                    col = _normalise(np.log(vals) if p.scale == "log" else vals)
                    self.objective.append((j, col.reshape(-1, 1)))
                    sizes = vals.min() > 0 and vals.max() / vals.min() >= LOG_RATIO
                    self.feasibility.append((j, (_normalise(np.log(vals)) if sizes else col).reshape(-1, 1)))
                    self.groups.append(("numeric", slice(width, width + 1)))
                    width += 1
                    odd = odd_part(vals)
                    if odd is not None:
                        self.odd.append((j, odd))
                    aligned = alignment(vals)
                    if aligned is not None:
                        self.objective.append((j, aligned.reshape(-1, 1)))
                        self.groups.append(("numeric", slice(width, width + 1)))
                        width += 1
                else:
                    k = len(p.values)
                    onehot = np.zeros((max(k, 1), max(k, 1)))
                    onehot[np.arange(k), np.arange(k)] = 1.0 / np.sqrt(2.0)
                    self.objective.append((j, onehot))
                    self.feasibility.append((j, onehot))
                    self.groups.append(("categorical", slice(width, width + onehot.shape[1])))
                    width += onehot.shape[1]
        for j, p in enumerate(params):
            if p.kind == "permutation":  # the space's own encoding: rank vectors (see space/encode.py)
                table = permutation_table(p)
                self.objective.append((j, table))
                self.feasibility.append((j, table))
                self.groups.append(("permutation", slice(width, width + table.shape[1])))
                width += table.shape[1]
        self.width = width
        self.feasibility_width = sum(t.shape[1] for _, t in self.feasibility)

    def __call__(self, rows: np.ndarray, feas: bool = False) -> np.ndarray:
        """(len(rows), width) float64 features of index rows (feasibility-model inputs with ``feas``)."""
        rows = np.asarray(rows)
        tables = self.feasibility if feas else self.objective
        out = np.empty((len(rows), self.feasibility_width if feas else self.width), dtype=np.float64)
        col = 0
        for j, table in tables:
            w = table.shape[1]
            out[:, col : col + w] = table[rows[:, j]]
            col += w
        return out

    def odd_parts(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), k) `odd_part` columns of index rows (k may be 0)."""
        rows = np.asarray(rows)
        out = np.empty((len(rows), len(self.odd)), dtype=np.float64)
        for col, (j, table) in enumerate(self.odd):
            out[:, col] = table[rows[:, j]]
        return out


def model_features(space: SearchSpace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[str, slice]]]:
    """(objective features, feasibility features, feature groups of the first)."""
    rows = np.asarray(rows)
    if not space.parameters:
        encoded = np.asarray(space.encode(rows), dtype=np.float64)
        return encoded, encoded, list(space.feature_groups)
    fmap = FeatureMap(space)
    return fmap(rows), fmap(rows, feas=True), list(fmap.groups)
