"""Space-filling initial designs on the candidates' encoding."""

from __future__ import annotations

import numpy as np

from .problem import Matrix

MAX_DESIGN_POOL = 4096


def feature_weights(n_features: int, feature_groups: list[tuple[str, slice]]) -> np.ndarray:
    """Per-column weights so that every parameter counts about the same in a distance.
    Categorical one-hot blocks are already scaled to distance 1 per change (see
    `features.py`); a permutation's rank vector is scaled down by its length."""
    w = np.ones(n_features)
    for kind, cols in feature_groups:
        width = cols.stop - cols.start
        if kind == "permutation" and width > 1:
            w[cols] = 1.0 / np.sqrt(width)
    return w


def maximin(
    x: Matrix,
    available: np.ndarray,
    chosen: np.ndarray,
    n: int,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Greedy maximin: each pick is the available candidate farthest from everything
    already chosen (observed and pending points included), over a random subset when
    the candidate set is large. Random first pick when nothing is chosen yet."""
    idx = np.flatnonzero(available)
    if len(idx) == 0 or n <= 0:
        return np.zeros(0, dtype=np.int64)
    if len(idx) > MAX_DESIGN_POOL:
        idx = np.sort(rng.choice(idx, size=MAX_DESIGN_POOL, replace=False))
    w = np.ones(x.shape[1]) if weights is None else weights
    pool = np.asarray(x[idx], dtype=np.float64) * w
    dmin = np.full(len(idx), np.inf)
    if len(chosen):
        for c in np.asarray(chosen, dtype=np.float64).reshape(-1, x.shape[1]) * w:
            dmin = np.minimum(dmin, ((pool - c) ** 2).sum(axis=1))
    picks: list[int] = []
    for _ in range(min(n, len(idx))):
        if np.all(np.isinf(dmin)):
            j = int(rng.integers(len(idx)))
        else:
            # Random tie-break: discrete spaces have many equidistant points.
            best = dmin.max()
            ties = np.flatnonzero(dmin >= best - 1e-12)
            j = int(ties[rng.integers(len(ties))])
        picks.append(int(idx[j]))
        dmin = np.minimum(dmin, ((pool - pool[j]) ** 2).sum(axis=1))
        dmin[j] = -np.inf
    return np.array(picks, dtype=np.int64)
