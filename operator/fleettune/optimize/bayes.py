"""Bayesian optimisation over a discrete candidate set with hidden constraints.

Per suggestion: one GP for log(time) on the feasible observations (failed points enter
it only as believers, see `_bayes`), one GP classifier for feasibility, LogEI +
feas_power * log P(feasible) over the not-yet-evaluated candidates, BaCO's randomised
feasibility threshold, Kriging believers for pending trials and for the rest of a batch.
After a long stall, every other pick stays within two moves of the best configuration
(see ``stall``). Hyperparameters are refitted on a schedule of history lengths, each
fit warm-started from the previous checkpoint's fit, so that a study rebuilt from its
stored history retraces the same fits and suggests the same.

Warm start (prior data from another pool): the best prior configurations are measured
first, then probes of the other code paths the prior may have wrongly ruled out (see
``_path_probes``); then this pool's log times are modelled as the prediction of a GP
fitted to the prior alone, shifted by their mean offset, plus a residual GP fitted to
this pool's data, refitted after each of its first evaluations (see ``warm_model``).
A prior that leaves the study ``prior_patience`` evaluations without improvement is
dropped: from then on the study is a cold one that keeps its own observations.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .acquisition import Believers, log_ei
from .design import feature_weights, maximin
from .feasibility import FeasibilityModel, fit_feasibility
from .gp import PREDICT_CHUNK, Hyper, Posterior, fit_hyper, matern52
from .problem import Candidates, History
from .strategy import Strategy

DEFAULTS: dict[str, Any] = {
    "initial": 10,  # space-filling design size (feasible points), before the model leads
    "refit_growth": 0.25,  # refit hyperparameters when the history grew by this fraction
    "fit_iter": 40,  # L-BFGS iterations per hyperparameter fit
    "max_pool": 20_000,  # candidates scored exactly per suggestion; beyond: subset + local search
    "tau_max": 1.0,  # feasibility threshold ~ U(0, tau_max), redrawn at every suggestion
    "feas_power": 6.0,  # acquisition = EI * P(feasible)^feas_power
    "transform": "log",  # objective transform: "log" (then standardise) or "copula" (ranks -> normal scores)
    "prior_top": 3,  # with warm-start data, first re-measure the best prior configurations
    "prior_paths": 3,  # ... and probe this many other code paths (see `_path_probes`)
    # With prior data, a study that goes this many evaluations without improving drops
    # the prior for good (see `prior_misleads`). 0: never.
    "prior_patience": 15,
    "local_starts": 5,
    "local_rounds": 3,
    # Warm start: refit on a schedule of this study's evaluations (after 1, 2, 3, 4, 6…)
    # rather than of the history with the prior in it (first refit 25 % later).
    "warm_refit": True,
    # Warm start: "task" models both pools in one GP with a task column; "residual" fits
    # a GP to the prior alone and models this pool as its prediction (shifted) plus a
    # residual GP of this pool's own data, which can learn that one parameter matters
    # differently here (a task column can only scale all of the prior's information).
    "warm_model": "residual",
    # After this many evaluations without improvement, every `stall_every`-th pick comes
    # from the best configuration's `stall_radius`-move neighbourhood. The way out of a
    # local optimum often takes two coordinated moves (GEMM: MDIMC 32 -> 16 together
    # with VWN 2 -> 4), which a model fitted to the whole space undervalues; triggered
    # earlier (20), it cost spaces whose optimum is isolated at 100 evaluations. 0: never.
    "stall": 30,
    "stall_radius": 2,
    "stall_every": 2,
}

# Integer options for which 0 switches the behaviour off (a TuningRun may set them to 0).
OFF_WITH_ZERO = frozenset({"stall", "prior_paths", "prior_patience"})


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
        self._fits: dict[tuple[int, int], tuple[Hyper | None, Hyper | None]] = {}
        self._weights = feature_weights(candidates.n_features, candidates.feature_groups)
        self._prior: tuple[int, Posterior, float, float] | None = None
        self._prior_cand: torch.Tensor | None = None
        self._paths: tuple[np.ndarray, np.ndarray] | None = None  # code-path keys, path of each candidate

    def _features(self, idx: np.ndarray, feas: bool = False) -> torch.Tensor:
        """Model inputs of candidates ``idx`` (all of them when it has their number: the
        scored pool is then every candidate, in order)."""
        src = self.candidates.xf if feas else self.candidates.x
        if len(idx) == len(src):
            return torch.as_tensor(np.asarray(src))  # shares a materialised matrix's memory
        return torch.from_numpy(np.asarray(src[idx]))

    # -- model ------------------------------------------------------------------------

    def _targets(self, history: History) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Transformed objective of the feasible points, each task on its own scale
        (a prior pool's absolute times say nothing about this one's), and noise."""
        if self._residual(history):
            ok, r, noise, _ = self._residual_targets(history)
            return ok, r, noise
        ok = np.flatnonzero(history.feasible)
        y = np.log(history.value[ok])
        noise = history.noise[ok].copy()
        z = np.zeros_like(y)
        for task in (0, 1):
            sel = history.task[ok] == task
            if not sel.any():
                continue
            z[sel], scale = _transform(y[sel], self.options["transform"])
            noise[sel] *= scale
        return ok, z, noise

    def _residual(self, history: History) -> bool:
        if self.options["warm_model"] != "residual":
            return False
        prior_ok = int((history.feasible & (history.task == 0)).sum())
        return prior_ok >= 2 and bool((history.feasible & (history.task == 1)).any())

    def _prior_model(self, history: History) -> tuple[Posterior, float, float]:
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
            hyper = fit_hyper(x, z, noise, max_iter=self.options["fit_iter"])
            self._prior = (n0, Posterior(x, z, noise, hyper), mu, sd)
            self._prior_cand = None
        return self._prior[1], self._prior[2], self._prior[3]

    def _prior_mean(self, history: History, idx: np.ndarray | None = None, rows: np.ndarray | None = None):
        """The prior GP's mean at candidates ``idx`` (cached for all) or at history ``rows``."""
        gp, _, _ = self._prior_model(history)
        if rows is not None:
            x = history.x[rows]
            return gp.predict(torch.as_tensor(x), fast=False)[0].numpy()
        if self._prior_cand is None:
            # Chunk by chunk (the chunks `predict` would make): no (N, f) matrix of all candidates.
            n, step = len(self.candidates), PREDICT_CHUNK
            parts = [gp.predict(self._features(np.arange(s, min(n, s + step))))[0] for s in range(0, n, step)]
            self._prior_cand = torch.cat(parts)
        return self._prior_cand if idx is None else self._prior_cand[torch.as_tensor(idx)]

    def _residual_targets(self, history: History) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """This pool's feasible points: their log times on the prior's scale minus the
        prior GP's prediction, centred (the mean offset is returned separately)."""
        _, mu, sd = self._prior_model(history)
        ok = np.flatnonzero(history.feasible & (history.task == 1))
        z = (np.log(history.value[ok]) - mu) / sd
        r = z - self._prior_mean(history, rows=ok)
        offset = float(r.mean())
        return ok, r - offset, history.noise[ok] / sd**2, offset

    def _marks(self, history: History, m: int) -> list[int]:
        """History lengths (up to ``m``) at which hyperparameters are refitted."""
        growth = self.options["refit_growth"]
        n0 = int((history.task == 0).sum())
        if self.options["warm_refit"] and n0 > 0 and m >= n0:
            return [n0 + c - 1 for c in checkpoints(m - n0 + 1, growth)]
        return checkpoints(m, growth)

    def _inputs(self, history: History, rows: np.ndarray | None = None, feas: bool = False) -> np.ndarray:
        hx = history.xf if feas else history.x
        x = hx if rows is None else hx[rows]
        if self._with_task(history) and (feas or not self._residual(history)):
            task = history.task if rows is None else history.task[rows]
            x = np.hstack([x, task.reshape(-1, 1).astype(np.float64)])
        return x

    @staticmethod
    def _with_task(history: History) -> bool:
        # A task column lets the GP learn how far prior data carry over (its length-scale
        # is the correlation between the old and the new pool): used, not blindly trusted.
        return bool((history.task == 0).any())

    def _fit(self, history: History, m: int) -> tuple[Hyper | None, Hyper | None]:
        key = (m, int((history.task == 0).sum()))  # a history without its prior is another chain
        if key in self._fits:
            return self._fits[key]
        marks = self._marks(history, m)
        prev = marks[-2] if len(marks) > 1 and marks[-1] == m else None
        init_r, init_c = self._fit(history, prev) if prev else (None, None)
        h = history.prefix(m)
        ok, z, noise = self._targets(h)
        if init_r is not None and len(init_r.lengthscale) != self._inputs(h, ok[:0]).shape[1]:
            init_r = None  # the previous fit had a task column (residual model from here on)
        hyper_r = None
        if len(ok) >= 2:
            hyper_r = fit_hyper(self._inputs(h, ok), z, noise, init=init_r, max_iter=self.options["fit_iter"])
        hyper_c = None
        feas = h.feasible
        if feas.any() and not feas.all():
            hyper_c = fit_feasibility(self._inputs(h, feas=True), feas, init_c, self.options["fit_iter"])
        self._fits[key] = (hyper_r or init_r, hyper_c or init_c)
        return self._fits[key]

    # -- proposing --------------------------------------------------------------------

    def propose(self, n: int, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        if self.prior_misleads(history):
            history = history.without_prior()
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

    def prior_misleads(self, history: History) -> bool:
        """Whether this study, with prior data, has at some point gone ``prior_patience``
        evaluations without improving: from then on the prior is dropped.

        The residual model trusts the prior's shape wherever this pool has no data, so a
        prior whose good region is bad here can hold the search in it: on the recorded
        A100 -> A4000 convolution, some warm runs stayed at 0.65-0.81 of the optimum
        for all 100 evaluations, while cold runs of the same seeds got past 0.95."""
        k = self.options["prior_patience"]
        if k <= 0 or not (history.task == 0).any():
            return False
        _, v = history.own_values()
        if len(v) <= k:
            return False
        improved = np.flatnonzero(np.concatenate([[True], v[1:] < np.minimum.accumulate(v)[:-1]]))
        gaps = np.diff(np.concatenate([improved, [len(v)]]))
        return bool(gaps.max() > k)

    def _prior_seeds(self, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        """While this study has measured fewer than ``prior_top`` points plus the probes
        of other code paths: the ``prior_top`` best prior configurations, then the probes
        (`_path_probes`).

        A driver update rarely reshuffles the top of a landscape, and measuring it here
        is how the prior gets checked rather than trusted. The probes come second: put
        first, they delayed the convolution RTX 2080 Ti -> 3090 warm start, where the 2080
        Ti's third best configuration is within 1 % of the 3090's optimum (30 seeds: 4.6
        evaluations to 0.95 instead of 2.8)."""
        n_current = int((history.task == 1).sum()) + len(pending)
        if n_current >= self.options["prior_top"] + 2 * self.options["prior_paths"]:
            return np.zeros(0, dtype=np.int64)
        prior = np.flatnonzero((history.task == 0) & history.feasible & (history.cand >= 0))
        order = history.cand[prior[np.argsort(history.value[prior], kind="stable")]]
        if len(order) == 0:
            return np.zeros(0, dtype=np.int64)
        probes = self._path_probes(history, int(order[0]))
        budget = self.options["prior_top"] + len(probes) - n_current
        out: list[int] = []
        top = self.options["prior_top"]
        for c in np.concatenate([order[:top], probes, order[top:]]):
            if len(out) >= budget:
                break
            if available[c] and c not in pending and c not in out:
                out.append(int(c))
        return np.array(out, dtype=np.int64)

    def _path_probes(self, history: History, best: int) -> np.ndarray:
        """Two probes in each of the ``prior_paths`` code paths (`features.switches`)
        other than ``best``'s whose best is predicted fastest: ``best`` moved onto the
        path, and the prior model's best there.

        A new GPU often favours another code path. The recorded RTX 3090's GEMM
        configurations within 5 % of its optimum all stage A in shared memory (SA=1) and
        rank 192nd or lower on the RTX 2080 Ti; the 2080 Ti's best configuration with SA
        switched to 1 reaches 0.987 of the 3090's optimum. On the A4000, the convolution
        wants neither shared memory nor the read-only cache, and other block sizes than
        on the A100: there the prior model's best on that path is the better probe.
        Either shows the residual model where the prior is wrong."""
        k = self.options["prior_paths"]
        cols = list(self.candidates.switches)
        if k <= 0 or not cols:
            return np.zeros(0, dtype=np.int64)
        if self._paths is None:
            keys, path = np.unique(self.candidates.rows[:, cols], axis=0, return_inverse=True)
            self._paths = (keys, path.reshape(-1).astype(np.int32))
        keys, path = self._paths
        mean = self._prior_mean(history).numpy().copy()
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

    def _design(self, n, history: History, pending, available, rng) -> np.ndarray:
        chosen = history.x[history.task == 1]
        if len(pending):
            chosen = np.vstack([chosen, self.candidates.x[pending]])
        return maximin(self.candidates.x, available, chosen, n, rng, self._weights)

    def _pool(self, history: History, available: np.ndarray, rng) -> tuple[np.ndarray, bool]:
        """Candidates to score exactly, and whether that is a subset of the available."""
        idx = np.flatnonzero(available)
        limit = self.options["max_pool"]
        if len(idx) <= limit:
            return idx, False
        # Too many to score: a fresh random subset plus the neighbourhoods of the best
        # points found so far (BaCO's local search starts from those too).
        sample = rng.choice(idx, size=limit // 2, replace=False)
        cur = np.flatnonzero(history.feasible & (history.task == 1) & (history.cand >= 0))
        best = cur[np.argsort(history.value[cur], kind="stable")[: self.options["local_starts"]]]
        near = self.candidates.hamming_neighbours(self.candidates.rows[history.cand[best]])
        out = np.unique(np.concatenate([sample, near]))
        return out[available[out]], True

    def _bayes(self, n, history: History, pending, available, rng) -> np.ndarray:
        hyper_r, hyper_c = self._fit(history, self._marks(history, len(history))[-1])
        ok, z, noise = self._targets(history)
        residual = self._residual(history)
        offset = self._residual_targets(history)[3] if residual else 0.0
        with_task = self._with_task(history)
        avail = available.copy()
        avail[pending] = False
        pool, partial = self._pool(history, avail, rng)
        if len(pool) == 0:
            return np.zeros(0, dtype=np.int64)
        width = self._inputs(history, ok[:0]).shape[1]
        if hyper_r is None or len(hyper_r.lengthscale) != width:
            # The last checkpoint had too few successes to fit (or was fitted before the
            # residual model took over): use the prior's hyperparameters.
            hyper_r = Hyper.default(width)
        gp = Posterior(self._inputs(history, ok), z, noise, hyper_r)
        failed = np.flatnonzero(~history.feasible & ((history.task == 1) | (not residual)))
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
        cur_ok = history.task[ok] == 1
        if residual:  # in prior units: residual + prior mean + offset
            best = float((z + self._prior_mean(history, rows=ok) + offset).min())
        else:
            best = float(z[cur_ok].min()) if cur_ok.any() else float(z.min())
        power = self.options["feas_power"]

        def feats(idx: np.ndarray, feas: bool = False) -> torch.Tensor:
            x = self._features(idx, feas)
            if with_task and (feas or not residual):
                x = torch.cat([x, torch.ones(len(idx), 1, dtype=x.dtype)], dim=1)
            return x

        def score(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            mean, var = gp.predict(feats(idx))
            if residual:
                mean = mean + self._prior_mean(history, idx) + offset
            log_pf = torch.zeros_like(mean)
            if clf is not None:
                log_pf = torch.log(clf.prob(feats(idx, feas=True)).clamp_min(1e-12))
            return mean, var, log_pf

        mean, var, log_pf = score(pool)
        if partial:
            pool, mean, var, log_pf = self._local_search(pool, mean, var, log_pf, avail, score, best)
        # Pending trials sit at the end of the scored set, believed but not selectable.
        scored = np.concatenate([pool, np.asarray(pending, dtype=np.int64)])
        if len(pending):
            m_p, v_p, l_p = score(np.asarray(pending, dtype=np.int64))
            mean, var, log_pf = torch.cat([mean, m_p]), torch.cat([var, v_p]), torch.cat([log_pf, l_p])
        xs = feats(scored)
        log_pf_w = power * log_pf
        tau = float(rng.uniform(0.0, self.options["tau_max"]))
        selectable = torch.zeros(len(scored), dtype=torch.bool)
        selectable[: len(pool)] = True
        if clf is not None:
            keep = selectable & (log_pf >= math.log(max(tau, 1e-12)))
            if keep.any():
                selectable = keep

        selectable = self._near_best_if_stalled(history, scored, selectable)
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

    def _near_best_if_stalled(self, history: History, scored: np.ndarray, selectable: torch.Tensor) -> torch.Tensor:
        k = self.options["stall"]
        stall, best = _stall(history)
        if k <= 0 or best < 0 or stall < k or (stall - k) % self.options["stall_every"]:
            return selectable
        rows = self.candidates.rows
        near = torch.as_tensor((rows[scored] != rows[best]).sum(axis=1) <= self.options["stall_radius"])
        return selectable & near if bool((selectable & near).any()) else selectable

    def _local_search(self, pool, mean, var, log_pf, avail, score, best):
        """BaCO-style multi-start local search on the acquisition: from the best scored
        candidates, score their one-move neighbourhoods; repeat while that improves."""
        seen = np.zeros(len(self.candidates), dtype=bool)
        seen[pool] = True
        power = self.options["feas_power"]
        acq = log_ei(mean, var, best) + power * log_pf
        for _ in range(self.options["local_rounds"]):
            top = pool[torch.topk(acq, min(self.options["local_starts"], len(acq))).indices.numpy()]
            near = self.candidates.hamming_neighbours(self.candidates.rows[top])
            near = near[avail[near] & ~seen[near]]
            if len(near) == 0:
                break
            seen[near] = True
            m, v, lp = score(near)
            a = log_ei(m, v, best) + power * lp
            improved = bool(a.max() > acq.max())
            pool = np.concatenate([pool, near])
            mean, var, log_pf, acq = (torch.cat(t) for t in ((mean, m), (var, v), (log_pf, lp), (acq, a)))
            if not improved:
                break
        return pool, mean, var, log_pf


def _stall(history: History) -> tuple[int, int]:
    """Evaluations of this study since its best so far, and that best's candidate."""
    cur, v = history.own_values()
    if len(cur) == 0 or not np.isfinite(v).any():
        return 0, -1
    b = int(np.argmin(v))
    return len(cur) - 1 - b, int(history.cand[cur[b]])


def _transform(y: np.ndarray, kind: str) -> tuple[np.ndarray, float]:
    """Standardised targets from log times, and the factor that carries a variance of
    log time into their units.

    "copula" maps ranks to normal scores (Salinas et al. 2020): kernel timings have a
    long tail of very slow configurations, and in log units the GP still spends its
    variance explaining them; with normal scores only the order matters.
    """
    if len(y) < 3:
        return y - y.mean(), 1.0
    sd = float(y.std())
    sd = sd if sd > 1e-12 else 1.0
    if kind == "copula":
        from scipy.special import ndtri
        from scipy.stats import rankdata

        z = ndtri((rankdata(y) - 0.5) / len(y))
        return z, float(z.std() / sd) ** 2
    return (y - y.mean()) / sd, 1.0 / sd**2
