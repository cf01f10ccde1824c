"""Bayesian optimisation over a discrete candidate set with hidden constraints.

Per suggestion: one GP for log(time) on the feasible observations, one Dirichlet GP
classifier for feasibility, LogEI + log P(feasible) over the not-yet-evaluated
candidates, BaCO's randomised feasibility threshold, Kriging believers for pending
trials and for the rest of a batch. Hyperparameters are refitted on a schedule of
history lengths, each fit warm-started from the previous checkpoint's fit, so that a
study rebuilt from its stored history retraces the same fits and suggests the same.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .acquisition import Believers, log_ei
from .design import feature_weights, maximin
from .feasibility import FeasibilityModel, fit_feasibility
from .gp import Hyper, Posterior, fit_hyper, matern52
from .problem import Candidates, History
from .strategy import Strategy, take_random

DEFAULTS: dict[str, Any] = {
    "initial": 10,  # space-filling design size (feasible points), before the model leads
    "refit_growth": 0.25,  # refit hyperparameters when the history grew by this fraction
    "fit_iter": 40,  # L-BFGS iterations per hyperparameter fit
    "max_pool": 20_000,  # candidates scored exactly per suggestion; beyond: subset + local search
    "tau_max": 1.0,  # feasibility threshold ~ U(0, tau_max), redrawn at every suggestion
    "feas_power": 2.0,  # acquisition = EI * P(feasible)^feas_power
    "prior_top": 3,  # with warm-start data, first re-measure the best prior configurations
    "local_starts": 5,
    "local_rounds": 3,
}


def checkpoints(m: int, growth: float) -> list[int]:
    """History lengths at which hyperparameters are refitted, up to ``m``."""
    out = [1]
    while True:
        nxt = out[-1] + max(1, math.ceil(out[-1] * growth))
        if nxt > m:
            return out
        out.append(nxt)


class BayesOpt(Strategy):
    name = "bayes"

    def __init__(self, candidates: Candidates, seed: int, options: dict[str, Any] | None = None) -> None:
        super().__init__(candidates, seed, {**DEFAULTS, **(options or {})})
        self._fits: dict[int, tuple[Hyper | None, Hyper | None]] = {}
        self._weights = feature_weights(candidates.n_features, candidates.feature_groups)
        self._xc = torch.as_tensor(candidates.x)
        self._xfc = torch.as_tensor(candidates.xf)

    # -- model ------------------------------------------------------------------------

    @staticmethod
    def _targets(history: History) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Standardised log objective of the feasible points, each task on its own scale
        (a prior pool's absolute times say nothing about this one's), and noise."""
        ok = np.flatnonzero(history.feasible)
        y = np.log(history.value[ok])
        noise = history.noise[ok].copy()
        z = np.zeros_like(y)
        for task in (0, 1):
            sel = history.task[ok] == task
            if not sel.any():
                continue
            mu = y[sel].mean()
            sd = y[sel].std() if sel.sum() > 2 else 0.0
            sd = sd if sd > 1e-9 else 1.0
            z[sel] = (y[sel] - mu) / sd
            noise[sel] /= sd * sd
        return ok, z, noise

    def _inputs(self, history: History, rows: np.ndarray | None = None, feas: bool = False) -> np.ndarray:
        hx = history.xf if feas else history.x
        x = hx if rows is None else hx[rows]
        if self._with_task(history):
            task = history.task if rows is None else history.task[rows]
            x = np.hstack([x, task.reshape(-1, 1).astype(np.float64)])
        return x

    @staticmethod
    def _with_task(history: History) -> bool:
        # A task column lets the GP learn how far prior data carry over (its length-scale
        # is the correlation between the old and the new pool): used, not blindly trusted.
        return bool((history.task == 0).any())

    def _fit(self, history: History, m: int) -> tuple[Hyper | None, Hyper | None]:
        if m in self._fits:
            return self._fits[m]
        marks = checkpoints(m, self.options["refit_growth"])
        prev = marks[-2] if len(marks) > 1 and marks[-1] == m else None
        init_r, init_c = self._fit(history, prev) if prev else (None, None)
        h = history.prefix(m)
        ok, z, noise = self._targets(h)
        hyper_r = None
        if len(ok) >= 2:
            hyper_r = fit_hyper(self._inputs(h, ok), z, noise, init=init_r, max_iter=self.options["fit_iter"])
        hyper_c = None
        feas = h.feasible
        if feas.any() and not feas.all():
            hyper_c = fit_feasibility(self._inputs(h, feas=True), feas, init_c, self.options["fit_iter"])
        self._fits[m] = (hyper_r or init_r, hyper_c or init_c)
        return self._fits[m]

    # -- proposing --------------------------------------------------------------------

    def propose(self, n: int, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        rng = self.rng(history, pending)
        current = history.task == 1
        n_current = int(current.sum())
        feasible_current = int((history.feasible & current).sum())
        has_prior = int((history.feasible & ~current).sum()) >= 2
        # Failed design points do not count: they are replaced, up to twice the design size.
        design_left = 0 if has_prior else self.options["initial"] - feasible_current - len(pending)
        if n_current < 2 * self.options["initial"] and design_left > 0:
            return self._design(n, history, pending, available, rng)
        if int(history.feasible.sum()) < 2:
            return self._design(n, history, pending, available, rng)
        seeds = self._prior_seeds(history, pending, available) if has_prior else np.zeros(0, dtype=np.int64)
        if len(seeds) >= n:
            return seeds[:n]
        rest = available.copy()
        rest[seeds] = False
        more = self._bayes(n - len(seeds), history, np.concatenate([pending, seeds]), rest, rng)
        return np.concatenate([seeds, more])

    def _prior_seeds(self, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        """The best prior configurations, while this study has measured fewer than
        ``prior_top`` points: a driver update rarely reshuffles the top of a landscape,
        and measuring them here is how the prior gets checked rather than trusted."""
        n_current = int((history.task == 1).sum()) + len(pending)
        budget = self.options["prior_top"] - n_current
        if budget <= 0:
            return np.zeros(0, dtype=np.int64)
        prior = np.flatnonzero((history.task == 0) & history.feasible & (history.cand >= 0))
        order = prior[np.argsort(history.value[prior], kind="stable")]
        out: list[int] = []
        for c in history.cand[order]:
            if available[c] and c not in pending and c not in out:
                out.append(int(c))
            if len(out) >= budget:
                break
        return np.array(out, dtype=np.int64)

    def _design(self, n, history: History, pending, available, rng) -> np.ndarray:
        chosen = history.x[history.task == 1]
        if len(pending):
            chosen = np.vstack([chosen, self.candidates.x[pending]])
        return maximin(self.candidates.x, available, chosen, n, rng, self._weights)

    def _pool(self, history: History, available: np.ndarray, rng) -> np.ndarray:
        idx = np.flatnonzero(available)
        limit = self.options["max_pool"]
        if len(idx) <= limit:
            return idx
        # Too many to score: a fresh random subset plus the neighbourhoods of the best
        # points found so far (BaCO's local search starts from those too).
        pool = [rng.choice(idx, size=limit // 2, replace=False)]
        cur = np.flatnonzero(history.feasible & (history.task == 1) & (history.cand >= 0))
        best = cur[np.argsort(history.value[cur], kind="stable")[: self.options["local_starts"]]]
        for c in history.cand[best]:
            pool.append(self.candidates.hamming_neighbours(self.candidates.rows[c]))
        out = np.unique(np.concatenate(pool))
        return out[available[out]]

    def _bayes(self, n, history: History, pending, available, rng) -> np.ndarray:
        hyper_r, hyper_c = self._fit(history, checkpoints(len(history), self.options["refit_growth"])[-1])
        ok, z, noise = self._targets(history)
        with_task = self._with_task(history)
        avail = available.copy()
        avail[pending] = False
        pool = self._pool(history, avail, rng)
        if len(pool) == 0:
            return np.zeros(0, dtype=np.int64)
        if hyper_r is None:
            return take_random(rng, avail, n)
        gp = Posterior(self._inputs(history, ok), z, noise, hyper_r)
        failed = np.flatnonzero(~history.feasible)
        if len(failed):
            # A failed point has no objective, but it has been looked at: condition on it
            # at the posterior mean (a believer that never resolves). The mean stays
            # exactly as the feasible data say, the variance there collapses, so EI stops
            # sending us into unmeasurable regions just because nothing is known there.
            xf = self._inputs(history, failed)
            z_fail, _ = gp.predict(torch.as_tensor(xf), fast=False)
            rows = np.concatenate([ok, failed])
            gp = Posterior(
                self._inputs(history, rows),
                np.concatenate([z, z_fail.numpy()]),
                np.concatenate([noise, np.zeros(len(failed))]),
                hyper_r,
            )
        clf = None
        if hyper_c is not None:
            clf = FeasibilityModel(self._inputs(history, feas=True), history.feasible, hyper_c)

        def feats(idx: np.ndarray, feas: bool = False) -> torch.Tensor:
            x = (self._xfc if feas else self._xc)[idx]
            if with_task:
                x = torch.cat([x, torch.ones(len(idx), 1, dtype=x.dtype)], dim=1)
            return x

        # Pending trials sit at the end of the scored set, believed but not selectable.
        scored = np.concatenate([pool, np.asarray(pending, dtype=np.int64)])
        xs = feats(scored)
        mean, var = gp.predict(xs)
        log_pf = torch.zeros_like(mean)
        log_pf_w = log_pf
        if clf is not None:
            log_pf = torch.log(clf.prob(feats(scored, feas=True)).clamp_min(1e-12))
        log_pf_w = self.options["feas_power"] * log_pf
        cur_ok = history.task[ok] == 1
        best = float(z[cur_ok].min()) if cur_ok.any() else float(z.min())
        tau = float(rng.uniform(0.0, self.options["tau_max"]))
        selectable = torch.zeros(len(scored), dtype=torch.bool)
        selectable[: len(pool)] = True
        if clf is not None:
            keep = selectable & (log_pf >= math.log(max(tau, 1e-12)))
            if keep.any():
                selectable = keep

        believers = Believers(var, gp.noise_extra)
        ks_all: torch.Tensor | None = None

        def believe(j: int) -> None:
            nonlocal ks_all
            if ks_all is None:  # only batches and pending trials pay for this
                ks_all = gp.cross(xs, fast=True)
            xb = xs[j : j + 1]
            w = (gp.k_inv @ gp.cross(xb).T).to(torch.float32)
            kb = matern52(xs.to(torch.float32), xb.to(torch.float32), gp.ls).squeeze(-1)
            cov0 = gp.s2 * kb - (ks_all @ w).squeeze(-1)
            believers.add(j, cov0)

        for j in range(len(pool), len(scored)):
            believe(j)
        picks: list[int] = []
        for _ in range(min(n, int(selectable.sum()))):
            acq = log_ei(mean, believers.var, best) + log_pf_w
            acq[~selectable] = -math.inf
            j = int(torch.argmax(acq))
            picks.append(int(scored[j]))
            selectable[j] = False
            if len(picks) < n:
                believe(j)
        return np.array(picks, dtype=np.int64)
