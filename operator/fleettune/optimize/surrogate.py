"""The models of one suggestion of the Bayesian strategy, assembled from a history.

`Surrogate.model(history, lengthscale, transform)` returns `Models`: a GP of the
objective on the feasible observations (log time, or with ``transform`` `RANKS` normal
scores of the times' ranks; with warm-start data, one GP with a task column until
`warm.WarmStart.residual`, then a GP of this pool's residuals over the prior GP's
prediction), conditioned also on every failed point at its own posterior mean (a
believer that never resolves); a feasibility classifier once something failed and
something ran; a classifier of the slow regime once there is one (`slow.SlowRegime`);
and the best value so far on the objective GP's scale. The hyperparameters are those of
the last checkpoint (`fitchain.FitChain`: `FEASIBILITY`, `SLOW` and each transform are
chains of their own), so the models are a function of the history alone and a study
rebuilt from it suggests the same. ``lengthscale`` replaces the objective GP's fitted
length-scales (a warm study's hedged picks take the prior GP's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch

from .feasibility import FeasibilityModel, fit_feasibility
from .fitchain import FitChain
from .gp import Hyper, Posterior, fit_hyper
from .problem import History
from .slow import SlowRegime
from .warm import WarmStart

FEASIBILITY = "feasibility"  # the classifier's chain of fits (`FitChain`), beside one per transform
SLOW = "slow"  # the slow-regime classifier's chain of fits (`slow.SlowRegime`)
LOG, RANKS = "log", "copula"  # the objective's transforms (`standardise`): log time, and its ranks


class Models(NamedTuple):
    """The models of one suggestion."""

    gp: Posterior  # log time (or its residual over the prior's prediction), failed points believed
    clf: FeasibilityModel | None  # None until something failed and something ran
    slow: FeasibilityModel | None  # P(not in the slow regime); None until there is one (slow_ratio)
    residual: bool
    offset: float  # residual model: mean offset of this pool over the prior
    with_task: bool  # inputs have a task column
    best: float  # best transformed value so far


class Surrogate:
    """The model assembly of a `BayesOpt`: what each model is fitted on, and the models
    of a history (see the module's doc).

    ``warm``: the strategy's warm start (the residual model's prior part); ``slow``: its
    slow regime; ``growth``, ``warm_refit``: the fit chain's schedule (`FitChain`);
    ``fit_iter``: L-BFGS iterations per fit."""

    def __init__(self, warm: WarmStart, slow: SlowRegime, *, growth: float, warm_refit: bool, fit_iter: int) -> None:
        self.warm = warm
        self.slow = slow
        self.fit_iter = fit_iter
        self.chain = FitChain(self._fit, growth=growth, warm_refit=warm_refit)

    def targets(self, history: History, transform: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Transformed objective of the feasible points, each task on its own scale
        (a prior pool's absolute times say nothing about this one's), and noise."""
        if self.warm.residual(history):
            ok, r, noise, _ = self.warm.residual_targets(history)
            return ok, r, noise
        ok = np.flatnonzero(history.feasible)
        y = np.log(history.value[ok])
        noise = history.noise[ok].copy()
        z = np.zeros_like(y)
        for task in (0, 1):
            sel = history.task[ok] == task
            if not sel.any():
                continue
            z[sel], scale = standardise(y[sel], transform)
            noise[sel] *= scale
        return ok, z, noise

    def inputs(self, history: History, rows: np.ndarray | None = None, feas: bool = False) -> np.ndarray:
        """Model inputs of the history's ``rows`` (all by default; the feasibility
        features with ``feas``), with a task column where one GP models both pools."""
        hx = history.xf if feas else history.x
        x = hx if rows is None else hx[rows]
        if self.with_task(history) and (feas or not self.warm.residual(history)):
            task = history.task if rows is None else history.task[rows]
            x = np.hstack([x, task.reshape(-1, 1).astype(np.float64)])
        return x

    @staticmethod
    def with_task(history: History) -> bool:
        # A task column lets the GP learn how far prior data carry over (its length-scale
        # is the correlation between the old and the new pool): used, not blindly trusted.
        return bool((history.task == 0).any())

    def hypers(self, history: History, m: int, transform: str) -> tuple[Hyper | None, Hyper | None, Hyper | None]:
        """Hyperparameters of the objective's GP on ``transform``'s scale, of the
        feasibility classifier and of the slow-regime one, as last fitted at or before
        history length ``m``."""
        chain = self.chain
        return chain.hyper(history, m, transform), chain.hyper(history, m, FEASIBILITY), chain.hyper(history, m, SLOW)

    def _fit(self, h: History, model: str, init: Hyper | None) -> Hyper | None:
        """One fit of the chain (`FitChain`): the objective's GP per scale (``model`` a
        transform), the classifiers (`FEASIBILITY`, `SLOW`) once for all scales, since
        their data do not depend on them."""
        hyper = None
        if model == FEASIBILITY:
            feas = h.feasible
            if feas.any() and not feas.all():
                hyper = fit_feasibility(self.inputs(h, feas=True), feas, init, self.fit_iter)
        elif model == SLOW:
            labelled = self.slow.labels(h)
            if labelled is not None:
                hyper = fit_feasibility(np.asarray(self.slow.inputs(labelled[0])), labelled[1], init, self.fit_iter)
        else:
            ok, z, noise = self.targets(h, model)
            if init is not None and len(init.lengthscale) != self.inputs(h, ok[:0]).shape[1]:
                init = None  # the previous fit had a task column (residual model from here on)
            if len(ok) >= 2:
                hyper = fit_hyper(self.inputs(h, ok), z, noise, init=init, max_iter=self.fit_iter)
        return hyper or init

    def model(self, history: History, lengthscale: np.ndarray | None = None, transform: str | None = None) -> Models:
        """Fit (when a checkpoint is due) and condition the models on ``history``; with
        ``lengthscale``, the objective's GP uses those length-scales instead of its fit's;
        ``transform``: `LOG` unless given."""
        transform = transform or LOG
        hyper_r, hyper_c, hyper_s = self.hypers(history, self.chain.marks(history, len(history))[-1], transform)
        ok, z, noise = self.targets(history, transform)
        residual = self.warm.residual(history)
        offset = self.warm.residual_targets(history)[3] if residual else 0.0
        width = self.inputs(history, ok[:0]).shape[1]
        if hyper_r is None or len(hyper_r.lengthscale) != width:
            # The last checkpoint had too few successes to fit (or was fitted before the
            # residual model took over): use the prior's hyperparameters.
            hyper_r = Hyper.default(width)
        if lengthscale is not None:
            hyper_r = replace(hyper_r, lengthscale=lengthscale)
        gp = Posterior(self.inputs(history, ok), z, noise, hyper_r)
        failed = np.flatnonzero(~history.feasible & ((history.task == 1) | (not residual)))
        if len(failed):
            # A failed point has no objective, but it has been looked at: condition on it
            # at the posterior mean (a believer that never resolves). The mean stays
            # exactly as the feasible data say, the variance there collapses, so EI stops
            # sending us into unmeasurable regions just because nothing is known there.
            xf = self.inputs(history, failed)
            z_fail, _ = gp.predict(torch.as_tensor(xf), fast=False)
            rows = np.concatenate([ok, failed])
            gp = Posterior(
                self.inputs(history, rows),
                np.concatenate([z, z_fail.numpy()]),
                np.concatenate([noise, np.zeros(len(failed))]),
                hyper_r,
            )
        clf = None
        if hyper_c is not None:
            clf = FeasibilityModel(self.inputs(history, feas=True), history.feasible, hyper_c)
        slow = None
        labelled = self.slow.labels(history)
        if hyper_s is not None and labelled is not None:
            slow = FeasibilityModel(np.asarray(self.slow.inputs(labelled[0])), labelled[1], hyper_s)
        cur_ok = history.task[ok] == 1
        if residual:  # in prior units: residual + prior mean + offset
            best = float((z + self.warm.mean_at_rows(history, ok) + offset).min())
        else:
            best = float(z[cur_ok].min()) if cur_ok.any() else float(z.min())
        return Models(gp, clf, slow, residual, offset, self.with_task(history), best)


def standardise(y: np.ndarray, kind: str) -> tuple[np.ndarray, float]:
    """Standardised targets from log times, and the factor that carries a variance of
    log time into their units.

    `RANKS` ("copula") maps ranks to normal scores (Salinas et al. 2020): kernel timings
    have a long tail of very slow configurations, and in log units the GP still spends
    its variance explaining them; with normal scores only the order matters.
    """
    if len(y) < 3:
        return y - y.mean(), 1.0
    sd = float(y.std())
    sd = sd if sd > 1e-12 else 1.0
    if kind == RANKS:
        from scipy.special import ndtri
        from scipy.stats import rankdata

        z = ndtri((rankdata(y) - 0.5) / len(y))
        return z, float(z.std() / sd) ** 2
    return (y - y.mean()) / sd, 1.0 / sd**2
