"""Which candidates the Bayesian strategy scores when there are too many to score all:
a fresh random subset plus the neighbourhoods of the best points found so far, refined
by a BaCO-style multi-start local search on the acquisition."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .acquisition import log_ei
from .problem import Candidates, History

Scores = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # posterior mean, variance, log P(feasible)

# Candidates scored exactly per suggestion; beyond, a random half of this many plus the
# local search (``max_pool``): `suggest(1)` after 220 observations stays within 100 ms on
# the 17,956-configuration GEMM and 1 s on 10^6 candidates.
MAX_POOL = 20_000
LOCAL_STARTS = 5  # the local search starts from this many of the best candidates (``local_starts``)
LOCAL_ROUNDS = 3  # and takes at most this many rounds of one-move neighbourhoods (``local_rounds``)


def scoring_pool(
    candidates: Candidates,
    history: History,
    available: np.ndarray,
    rng: np.random.Generator,
    *,
    limit: int,
    starts: int,
) -> tuple[np.ndarray, bool]:
    """Candidates to score exactly (at most about ``limit``), and whether that is a subset
    of the available."""
    idx = np.flatnonzero(available)
    if len(idx) <= limit:
        return idx, False
    # Too many to score: a fresh random subset plus the neighbourhoods of the best
    # points found so far (BaCO's local search starts from those too).
    sample = rng.choice(idx, size=limit // 2, replace=False)
    cur = np.flatnonzero(history.feasible & (history.task == 1) & (history.cand >= 0))
    best = cur[np.argsort(history.value[cur], kind="stable")[:starts]]
    near = candidates.hamming_neighbours(candidates.rows[history.cand[best]])
    out = np.unique(np.concatenate([sample, near]))
    return out[available[out]], True


def local_search(
    candidates: Candidates,
    pool: np.ndarray,
    scores: Scores,
    avail: np.ndarray,
    score: Callable[[np.ndarray], Scores],
    best: float,
    *,
    power: float,
    rounds: int,
    starts: int,
    misfit: float = 0.0,
) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the ``starts`` best scored candidates (acquisition: LogEI + ``power`` x log
    P(feasible); ``misfit`` added to the variance, as the strategy's acquisition does), score
    their one-move neighbourhoods; repeat while that improves, at most ``rounds`` times.
    Returns the scored candidates and their scores, extended."""
    mean, var, log_pf = scores
    seen = np.zeros(len(candidates), dtype=bool)
    seen[pool] = True
    acq = log_ei(mean, var + misfit, best) + power * log_pf
    for _ in range(rounds):
        top = pool[torch.topk(acq, min(starts, len(acq))).indices.numpy()]
        near = candidates.hamming_neighbours(candidates.rows[top])
        near = near[avail[near] & ~seen[near]]
        if len(near) == 0:
            break
        seen[near] = True
        m, v, lp = score(near)
        a = log_ei(m, v + misfit, best) + power * lp
        improved = bool(a.max() > acq.max())
        pool = np.concatenate([pool, near])
        mean, var, log_pf, acq = (torch.cat(t) for t in ((mean, m), (var, v), (log_pf, lp), (acq, a)))
        if not improved:
            break
    return pool, mean, var, log_pf
