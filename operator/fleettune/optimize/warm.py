"""Warm start of the Bayesian strategy from prior data (task 0 of the history: the
results of another pool, driver or problem size).

The best prior configurations are measured first, then probes of the other code paths
the prior may have wrongly ruled out (`WarmStart.path_probes`); then this pool's log
times are modelled as the prediction of a GP fitted to the prior alone, shifted by their
mean offset, plus a residual GP fitted to this pool's data (the "residual" warm model).
A prior that leaves the study ``patience`` evaluations without improvement is dropped
(`WarmStart.misleads`).

Why checked rather than trusted, and the measurements behind these choices: see
docs/optimizer.md.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import numpy as np
import torch

from .gp import PREDICT_CHUNK, Posterior, fit_hyper
from .problem import Candidates, History


def _none() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


class WarmStart:
    """The prior-data part of a `BayesOpt`: the prior's own GP (fitted once: the prior
    does not change), the first suggestions of a warm study, and when to drop the prior.

    ``features(idx, feas)``: model inputs of candidates ``idx`` as a tensor; ``fitting()``:
    the strategy's timer for model fits.
    """

    def __init__(
        self,
        candidates: Candidates,
        features: Callable[[np.ndarray], torch.Tensor],
        fitting: Callable[[], AbstractContextManager[None]],
        *,
        top: int,
        paths: int,
        patience: int,
        residual: bool,
        fit_iter: int,
    ) -> None:
        self.candidates = candidates
        self._features = features
        self._fitting = fitting
        self.top, self.paths, self.patience = top, paths, patience
        self.residual_model, self.fit_iter = residual, fit_iter
        self._prior: tuple[int, Posterior, float, float] | None = None
        self._prior_cand: torch.Tensor | None = None
        self._paths: tuple[np.ndarray, np.ndarray] | None = None  # code-path keys, path of each candidate

    # -- the residual model -------------------------------------------------------------

    def residual(self, history: History) -> bool:
        """Whether this pool is modelled as the prior's prediction plus a residual GP."""
        if not self.residual_model:
            return False
        prior_ok = int((history.feasible & (history.task == 0)).sum())
        return prior_ok >= 2 and bool((history.feasible & (history.task == 1)).any())

    def model(self, history: History) -> tuple[Posterior, float, float]:
        """GP of the prior data alone (fitted once: the prior does not change), and the
        mean and spread of its log times."""
        n0 = int((history.task == 0).sum())
        if self._prior is None or self._prior[0] != n0:
            rows = np.flatnonzero(history.feasible & (history.task == 0))
            y = np.log(history.value[rows])
            mu, sd = float(y.mean()), float(y.std()) or 1.0
            z = (y - mu) / sd
            noise = history.noise[rows] / sd**2
            x = history.x[rows]
            with self._fitting():
                hyper = fit_hyper(x, z, noise, max_iter=self.fit_iter)
            self._prior = (n0, Posterior(x, z, noise, hyper), mu, sd)
            self._prior_cand = None
        return self._prior[1], self._prior[2], self._prior[3]

    def mean_at_candidates(self, history: History, idx: np.ndarray | None = None) -> torch.Tensor:
        """The prior GP's mean at candidates ``idx`` (all of them by default; cached)."""
        gp, _, _ = self.model(history)
        if self._prior_cand is None:
            # Chunk by chunk (the chunks `predict` would make): no (N, f) matrix of all candidates.
            n, step = len(self.candidates), PREDICT_CHUNK
            parts = [gp.predict(self._features(np.arange(s, min(n, s + step))))[0] for s in range(0, n, step)]
            self._prior_cand = torch.cat(parts)
        return self._prior_cand if idx is None else self._prior_cand[torch.as_tensor(idx)]

    def mean_at_rows(self, history: History, rows: np.ndarray) -> np.ndarray:
        """The prior GP's mean at the history's ``rows``."""
        gp, _, _ = self.model(history)
        return gp.predict(torch.as_tensor(history.x[rows]), fast=False)[0].numpy()

    def residual_targets(self, history: History) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """This pool's feasible points: their log times on the prior's scale minus the
        prior GP's prediction, centred (the mean offset is returned separately)."""
        _, mu, sd = self.model(history)
        ok = np.flatnonzero(history.feasible & (history.task == 1))
        z = (np.log(history.value[ok]) - mu) / sd
        r = z - self.mean_at_rows(history, ok)
        offset = float(r.mean())
        return ok, r - offset, history.noise[ok] / sd**2, offset

    # -- when to drop the prior ---------------------------------------------------------

    def misleads(self, history: History) -> bool:
        """Whether this study, with prior data, has at some point gone ``patience``
        evaluations without improving: from then on the prior is dropped.

        The residual model trusts the prior's shape wherever this pool has no data, so a
        prior whose good region is bad here can hold the search in it, while a cold start
        would get past it."""
        k = self.patience
        if k <= 0 or not (history.task == 0).any():
            return False
        _, v = history.own_values()
        if len(v) <= k:
            return False
        improved = np.flatnonzero(np.concatenate([[True], v[1:] < np.minimum.accumulate(v)[:-1]]))
        gaps = np.diff(np.concatenate([improved, [len(v)]]))
        return bool(gaps.max() > k)

    # -- the first suggestions of a warm study ------------------------------------------

    def seeds(self, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        """While this study has measured fewer than ``top`` points plus the probes of other
        code paths: the ``top`` best prior configurations, then the probes (`path_probes`).

        A driver update rarely reshuffles the top of a landscape, and measuring it here
        is how the prior gets checked rather than trusted. The probes come second: put
        first, they delay the warm starts whose prior's top is already right here."""
        n_current = int((history.task == 1).sum()) + len(pending)
        if n_current >= self.top + 2 * self.paths:
            return _none()
        prior = np.flatnonzero((history.task == 0) & history.feasible & (history.cand >= 0))
        order = history.cand[prior[np.argsort(history.value[prior], kind="stable")]]
        if len(order) == 0:
            return _none()
        probes = self.path_probes(history, int(order[0]))
        budget = self.top + len(probes) - n_current
        out: list[int] = []
        for c in np.concatenate([order[: self.top], probes, order[self.top :]]):
            if len(out) >= budget:
                break
            if available[c] and c not in pending and c not in out:
                out.append(int(c))
        return np.array(out, dtype=np.int64)

    def path_probes(self, history: History, best: int) -> np.ndarray:
        """Two probes in each of the ``paths`` code paths (`features.switches`) other
        than ``best``'s whose best is predicted fastest: ``best`` moved onto the path,
        and the prior model's best there.

        A new GPU often favours another code path (shared memory or not, another block
        shape): sometimes the prior's best with the path switched is the good probe,
        sometimes the prior model's best on that path. Either shows the residual model
        where the prior is wrong."""
        k = self.paths
        cols = list(self.candidates.switches)
        if k <= 0 or not cols:
            return _none()
        keys, path = self._code_paths(cols)
        mean = self.mean_at_candidates(history).numpy().copy()
        mean[history.cand[(history.task == 0) & ~history.feasible & (history.cand >= 0)]] = np.inf
        order = np.argsort(mean, kind="stable")
        _, first = np.unique(path[order], return_index=True)
        leaders = order[first]  # the predicted best of each path
        leaders = leaders[np.isfinite(mean[leaders]) & (path[leaders] != path[best])]
        out: list[int] = []
        for c in leaders[np.argsort(mean[leaders], kind="stable")][:k]:
            moved = self.candidates.rows[best].copy()
            moved[cols] = keys[path[c]]
            for probe in (int(self.candidates.lookup(moved)[0]), int(c)):
                if probe >= 0 and probe not in out:
                    out.append(probe)
        return np.array(out, dtype=np.int64)

    def _code_paths(self, cols: list[int]) -> tuple[np.ndarray, np.ndarray]:
        if self._paths is None:
            keys, path = np.unique(self.candidates.rows[:, cols], axis=0, return_inverse=True)
            self._paths = (keys, path.reshape(-1).astype(np.int32))
        return self._paths
