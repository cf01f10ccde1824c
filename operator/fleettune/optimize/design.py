"""Space-filling initial designs on the candidates' encoding."""

from __future__ import annotations

import numpy as np

from .problem import Matrix

MAX_DESIGN_POOL = 4096
# A design pick is uniformly random, not the farthest point, with the probability that
# the design's points failed so far (``design_random``). Maximin goes to the extremes of
# the space (the largest blocks and tiles), where resource limits make configurations
# fail: on a space where most of them fail, a design that kept replacing failed extremes
# by the next-farthest ones found less in 20 evaluations than random sampling does. Where
# few configurations fail, the design stays maximin, whose extremes are often where the
# optimum is (always random picks: convolution_milo 0.84 → 0.77 at 40 evaluations).
DESIGN_RANDOM = True


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


def design_picks(
    x: Matrix,
    available: np.ndarray,
    chosen: np.ndarray,
    failed_share: float,
    n: int,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """``n`` design picks among ``available``: each uniformly random with probability
    ``failed_share`` (see `DESIGN_RANDOM`), otherwise `maximin` from ``chosen`` and the
    picks before it."""
    picks: list[int] = []
    avail = available.copy()
    chosen = np.asarray(chosen, dtype=np.float64).reshape(-1, x.shape[1])
    for _ in range(n):
        if failed_share > 0 and rng.random() < failed_share:
            idx = np.flatnonzero(avail)
            pick = idx[rng.integers(len(idx))] if len(idx) else None
        else:
            one = maximin(x, avail, chosen, 1, rng, weights)
            pick = one[0] if len(one) else None
        if pick is None:
            break
        picks.append(int(pick))
        avail[pick] = False
        chosen = np.vstack([chosen, np.asarray(x[int(pick)], dtype=np.float64).reshape(1, -1)])
    return np.array(picks, dtype=np.int64)


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
