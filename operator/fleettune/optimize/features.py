"""Model inputs built from the space's type-aware encoding.

* categorical codes (i/(k-1) in the space's encoding, meaningful only as same/different)
  become one-hot columns scaled by 1/sqrt(2), so that a Euclidean kernel sees a
  Hamming distance of 1 per changed category, never an order;
* the feasibility model additionally gets linear positive size-like parameters on a
  log scale: GPU resource limits are products of sizes (threads = bx*by, registers ~
  block x tile), and a product threshold is a straight boundary in log coordinates;
* integer sizes that reach a warp (32) whose values are not all powers of two get a
  second objective column, the value's power-of-two divisibility (see `alignment`);
* numeric and permutation columns are used as the space encodes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
    told apart from both. On the recorded A4000 convolution space, block widths 32, 64,
    128 and 256 all come within 2 % of the optimum; the widths between them (48, 80,
    96, …) reach at most 81 %. Small factors (tiles of 1..8) change the work per
    thread smoothly; there the column is noise the model must first learn to ignore
    (in the unit replay, whose tile acts smoothly, the fraction of the optimum after
    30 trials fell from at least 0.93, the test's bar, to 0.73).
    """
    if values.max() < WARP or not np.all((values == np.round(values)) & (values > 0)):
        return None
    ints = values.astype(np.int64)
    if np.all((ints & (ints - 1)) == 0):
        return None  # the log of the value already is its divisibility
    twos = np.log2((ints & -ints).astype(np.float64))
    return None if twos.max() <= twos.min() else _normalise(twos)


def switches(space: Any) -> tuple[int, ...]:
    """Parameters that choose a code path rather than a size: booleans, categoricals
    and 0/1 integers (how Kernel Tuner spaces spell a flag such as ``use_shmem``).

    A new GPU or driver often changes which code path wins (shared memory or the
    read-only cache, staging A in shared memory or not); a warm start probes the other
    paths (see ``BayesOpt._path_probes``)."""
    out = []
    for j, p in enumerate(getattr(space, "parameters", ()) or ()):
        if len(p.values) < 2 or p.kind == "permutation":
            continue
        if p.kind == "categorical" or p.type == "boolean" or sorted(p.values) == [0, 1]:
            out.append(j)
    return tuple(out)


def model_features(space: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[str, slice]]]:
    """(objective features, feasibility features, feature groups of the first)."""
    rows = np.asarray(rows)
    encoded = np.asarray(space.encode(rows), dtype=np.float64)
    params = getattr(space, "parameters", None)
    groups = list(getattr(space, "feature_groups", []))
    if params is None:
        return encoded, encoded, groups
    obj_cols: list[np.ndarray] = []
    feas_cols: list[np.ndarray] = []
    out_groups: list[tuple[str, slice]] = []
    width = 0
    for kind in ("numeric", "categorical"):
        for j, p in enumerate(params):
            if p.kind != kind:
                continue
            if kind == "numeric":
                vals = np.asarray(p.values, dtype=np.float64)
                scaled = np.log(vals) if p.scale == "log" else vals
                col = _normalise(scaled)[rows[:, j]].reshape(-1, 1)
                obj_cols.append(col)
                sizes = vals.min() > 0 and vals.max() / vals.min() >= LOG_RATIO
                feas_cols.append(_normalise(np.log(vals))[rows[:, j]].reshape(-1, 1) if sizes else col)
                out_groups.append(("numeric", slice(width, width + 1)))
                width += 1
                aligned = alignment(vals)
                if aligned is not None:
                    obj_cols.append(aligned[rows[:, j]].reshape(-1, 1))
                    out_groups.append(("numeric", slice(width, width + 1)))
                    width += 1
            else:
                k = len(p.values)
                onehot = np.zeros((len(rows), max(k, 1)))
                onehot[np.arange(len(rows)), rows[:, j]] = 1.0 / np.sqrt(2.0)
                obj_cols.append(onehot)
                feas_cols.append(onehot)
                out_groups.append(("categorical", slice(width, width + onehot.shape[1])))
                width += onehot.shape[1]
    for kind, cols in groups:
        if kind == "permutation":
            obj_cols.append(encoded[:, cols])
            feas_cols.append(encoded[:, cols])
            out_groups.append(("permutation", slice(width, width + cols.stop - cols.start)))
            width += cols.stop - cols.start
    if not obj_cols:
        return encoded, encoded, groups
    return np.hstack(obj_cols), np.hstack(feas_cols), out_groups
