"""Bayesian optimisation over a discrete candidate set with hidden constraints.

Per suggestion: one GP for log(time) on the feasible observations (failed points enter
it only as believers, see `_bayes`; every `RANK_EVERY`-th pick of a study without a
prior, a GP of the times' ranks instead), one GP classifier for feasibility and, once a
share of the results is `SLOW_RATIO` times slower than the best, one for that slow
regime, LogEI + `FEAS_POWER` * log P(feasible, not slow) over the not-yet-evaluated
candidates (EI on the model's
variance plus the misfit it learned, see ``misfit_ei``), BaCO's randomised
feasibility threshold, Kriging believers for pending trials and for the rest of a batch.
After a long stall (gains within ``min_gain`` do not end one), every other pick stays
within two moves of the best configuration, its other code paths first, then those of the
best configuration of another region almost as good (see ``stall``, `STALL_PATHS`,
`STALL_LEADERS`). Hyperparameters are refitted on a schedule of history lengths, each fit
warm-started from the previous checkpoint's fit, so that a study rebuilt from its stored
history retraces the same fits and suggests the same.

Warm start (prior data from another pool) is `warm.WarmStart`: the best prior
configurations and probes of other code paths first (on a prior's plateau, its best and
space-filling points of the plateau instead, `warm.PRIOR_PLATEAU`), then a residual model on top
of the prior's GP, refitted after each of this pool's first evaluations (`WARM_REFIT`); after
the first suggestions, every `PRIOR_HEDGE`-th pick is the model's pick from this pool's results
alone (with the prior GP's length-scales, `PRIOR_LENGTHSCALES`); a prior that leaves the
study ``prior_patience`` evaluations without improvement is dropped, and from then on the
study is a cold one that keeps its own observations.

The options a TuningRun sets are declared in `BayesOptions`; the internal knobs are this
and the other optimize modules' constants, which a development caller can change through
`BayesTuning` (`Study`'s ``tuning``). The measurements behind their values are in
docs/decisions.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from .acquisition import FEAS_POWER, TAU_MAX, Believers, log_ei
from .design import feature_weights, maximin
from .feasibility import FeasibilityModel, fit_feasibility
from .gp import FIT_ITER, Hyper, Posterior, fit_hyper, matern52
from .local import LOCAL_ROUNDS, LOCAL_STARTS, MAX_POOL, Scores, local_search, scoring_pool
from .options import StrategyOptions, Tuning, boolean, fixed, integer, non_negative, positive
from .problem import Candidates, History
from .stopping import improvements
from .strategy import Strategy
from .warm import PRIOR_COMBINE, PRIOR_PATHS, PRIOR_PLATEAU, SKIP_SEEDS_BELOW, WarmStart

LEADER_GAP = 0.03  # a runner-up region's best is at most this much slower than the best (stall_leaders)
FEASIBILITY = "feasibility"  # the classifier's chain of fits (`BayesOpt._chain`), beside one per transform
SLOW = "slow"  # the slow-regime classifier's chain of fits (SLOW_RATIO)
LOG, RANKS = "log", "copula"  # the objective's transforms (`_transform`): log time, and its ranks for RANK_EVERY
SLOW_SHARE = 0.1  # SLOW_RATIO: the classifier is fitted once this share of the results is that slow...
SLOW_LEAST = 3  # ...and at least this many: a few outliers are not a regime


# Refit the hyperparameters each time the history grew by this fraction (``refit_growth``):
# a checkpoint schedule fixed by the history's length, so a rebuilt study retraces the fits.
REFIT_GROWTH = 0.25
# Warm start: refit on a schedule of this study's own evaluations (after 1, 2, 3, 4, 6, ...)
# rather than of the history with the prior in it (``warm_refit``).
WARM_REFIT = True
# Measured configurations more than this many times slower than the study's best are a
# regime of their own (``slow_ratio``; 0: never): once `SLOW_SHARE` of its results (and
# `SLOW_LEAST`) are, a second classifier learns where they lie, from the feasibility
# model's inputs plus the odd part of each integer size, and the acquisition weighs
# P(not that slow) as it weighs P(feasible). On AMD GPUs most convolution_milo
# configurations (a tile of 3, a block width of 48) run 30-100 times slower than the best;
# on the NVIDIA recordings no regime that slow exists and nothing changes.
SLOW_RATIO = 20.0
# Without warm-start data (or once it is dropped), every this-many-th model pick ranks by a
# GP of the objective's ranks (normal scores, `_transform` "copula") rather than of log
# time (``rank_every``; 0: never): where most configurations are 10-100 times slower than
# the best, log times spend the model on that tail; ranks cannot see how much slower a code
# path is, which other spaces need, hence a share of the picks.
RANK_EVERY = 3
# With warm-start data, once the prior's first picks are measured, every this-many-th pick
# is the model's pick from this pool's own results alone (``prior_hedge``; 0: never): a
# prior whose best region is only good here then holds the search in the other picks only.
PRIOR_HEDGE = 2
# Those picks' model uses the prior GP's length-scales instead of its own while the prior
# keeps its weight (``prior_lengthscales``): a warm study's own first points, clustered
# around the prior's best, cannot tell which parameters matter.
PRIOR_LENGTHSCALES = True
# A stalled study (``stall`` evaluations without progress) makes every STALL_EVERY-th pick
# within STALL_RADIUS moves of the best configuration (``stall_every``, ``stall_radius``):
# the way out of a local optimum often takes two coordinated moves.
STALL_EVERY = 2
STALL_RADIUS = 2
# Those near picks first try the best configuration on other code paths (only its switches
# changed), then its whole neighbourhood (``stall_paths``): the way off one code path's
# optimum can take two flags flipped together.
STALL_PATHS = True
# ...and then the other code paths of this many runners-up from other regions (each more
# than STALL_RADIUS moves from the best and the runners-up before it, within `LEADER_GAP`
# of the best; ``stall_leaders``, 0: none): a narrow optimum can sit one flag away from a
# region almost as good as the best, far from the best.
STALL_LEADERS = 1


@dataclass(frozen=True)
class BayesTuning(Tuning):
    """The Bayesian strategy's internal knobs, at the constants of the modules that use
    them: a development hook (`Study`'s ``tuning``) for benchmarks that flip a heuristic
    and tests that fit faster. A TuningRun cannot set them (`BayesOptions.removed`)."""

    refit_growth: float = positive(REFIT_GROWTH, "Refit the hyperparameters when the history grew by this fraction.")
    fit_iter: int = integer(FIT_ITER, "L-BFGS iterations per hyperparameter fit.")
    max_pool: int = integer(MAX_POOL, "Candidates scored exactly per suggestion; beyond, a subset and a local search.")
    local_starts: int = integer(LOCAL_STARTS, "Local search: start from this many of the best candidates.")
    local_rounds: int = integer(LOCAL_ROUNDS, "Local search: at most this many rounds of one-move neighbourhoods.")
    tau_max: float = positive(TAU_MAX, "Feasibility threshold ~ U(0, tau_max), redrawn at every suggestion.")
    feas_power: float = positive(FEAS_POWER, "Acquisition = EI x P(feasible)^feas_power.")
    slow_ratio: float = non_negative(SLOW_RATIO, "Times slower than the best that make a slow regime; 0: never.")
    rank_every: int = integer(RANK_EVERY, "Every this-many-th cold model pick ranks by the times' ranks; 0: never.",
                              low=0)
    stall_radius: int = integer(STALL_RADIUS, "Moves from the best configuration that a stalled study's picks stay "
                                "within.")
    stall_every: int = integer(STALL_EVERY, "In a stalled study, every this-many-th pick stays near the best.")
    stall_paths: bool = boolean(STALL_PATHS, "A stalled study's near picks try the best's other code paths first.")
    stall_leaders: int = integer(STALL_LEADERS, "Then the code paths of this many runners-up; 0: none.", low=0)
    prior_paths: int = integer(PRIOR_PATHS, "Code paths probed after the prior's best; 0: none.", low=0,
                               warm_only=True)
    prior_combine: bool = boolean(PRIOR_COMBINE, "Measure the prior best's two helping moves together.",
                                  warm_only=True)
    prior_hedge: int = integer(PRIOR_HEDGE, "Every this-many-th warm pick from this pool's results alone; 0: never.",
                               low=0, warm_only=True)
    prior_plateau: float = non_negative(PRIOR_PLATEAU, "Share of the candidates on the prior's plateau that makes "
                                        "it one; 0: never.", warm_only=True)
    prior_lengthscales: bool = boolean(PRIOR_LENGTHSCALES, "The hedged picks' model takes the prior GP's "
                                       "length-scales.", warm_only=True)
    warm_refit: bool = boolean(WARM_REFIT, "Refit on a schedule of this study's own evaluations.", warm_only=True)


@dataclass(frozen=True)
class BayesOptions(StrategyOptions):
    """What a user sets: the design's size, how far expected improvement looks past the
    model's mean, when a stalled study looks near its best, what counts as progress, and
    how much a warm start re-measures and how long it keeps a prior that does not help."""

    removed: ClassVar[Mapping[str, str]] = {
        **fixed(BayesTuning),
        "transform": 'it is now fixed at "log"; a third of a cold study\'s picks rank by a GP of the times\' ranks '
        "instead (every pick on ranks lost, docs/decisions.md)",
        "warm_model": 'it is now fixed at "residual": the prior\'s GP plus a GP of this pool\'s residuals (one GP '
        "with a task column lost, docs/decisions.md)",
    }

    initial: int = integer(
        10, "Size of the space-filling initial design, in feasible points (failed ones are replaced, up to twice "
        "this many evaluations), before the model leads. Fewer leave the model surer of a landscape it has seen "
        "less of: on the replay 6 took the mean fraction of the optimum at 100 evaluations 0.981 → 0.977 "
        "(convolution_milo-A100 0.909 → 0.864) and 8 cost 0.006, for at most 0.01 at the early budgets."
    )
    misfit_ei: float = non_negative(
        1.0, "Share of the surrogate's misfit (the noise it learns on top of the repeats' own) that expected "
        "improvement counts as variation a configuration not yet measured can still show: higher explores more "
        "around good configurations, 0 trusts the smooth model's mean. Kernel times are rougher than a smooth "
        "model: 1 against 0 took the replay at 100 evaluations 0.980 → 0.983 (convolution_milo-A100 0.895 → "
        "0.937). Counted for a pick with nothing outstanding (not for a batch's later picks or with trials in "
        "flight)."
    )
    stall: int = integer(
        30, "After this many evaluations without progress (see min_gain), every other pick stays within two moves "
        "of the best configuration, its other code paths first: the way out of a local optimum often takes two "
        "coordinated moves, which a model fitted to the whole space undervalues. Triggered at 20, the spaces with "
        "an isolated optimum lost (convolution_milo-A100 0.936 → 0.911 at 100 evaluations). 0: never.", low=0,
    )
    min_gain: float = non_negative(
        0.01, "An evaluation counts as progress, for stall and prior_patience, only when it is faster than the best "
        "so far by more than this fraction: about the timing noise of 32 timed runs (raise it for noisier "
        "timings). Against every gain counting, the warm pairs' evaluations to 0.95 fell from 0.42 to 0.40 of "
        "cold's and the replay at 100 rose 0.985 → 0.986. 0: every improvement counts."
    )
    prior_top: int = integer(
        3, "With warm-start data, first re-measure this many of the best prior configurations (then code-path "
        "probes and the model): a driver update rarely reshuffles the top of a landscape. 5 cost most warm "
        "pairs two evaluations (warm/cold 0.361 → 0.380).", warm_only=True,
    )
    prior_patience: int = integer(
        15, "With warm-start data, a study that goes this many evaluations without progress (see min_gain) drops "
        "the prior for good: without it, warm runs of A100 → A4000 convolution stayed at 0.65-0.81 of the "
        "optimum for 100 evaluations where cold ones passed 0.95; 10 cost four of the six gemm pairs 2.5-7.6 "
        "evaluations. 0: never.", low=0, warm_only=True,
    )


class _Model(NamedTuple):
    """The models of one suggestion."""

    gp: Posterior  # log time (or its residual over the prior's prediction), failed points believed
    clf: FeasibilityModel | None  # None until something failed and something ran
    slow: FeasibilityModel | None  # P(not in the slow regime); None until there is one (slow_ratio)
    residual: bool
    offset: float  # residual model: mean offset of this pool over the prior
    with_task: bool  # inputs have a task column
    best: float  # best transformed value so far


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
    Options = BayesOptions
    Tuning = BayesTuning
    options: BayesOptions
    tuning: BayesTuning

    def __init__(
        self, candidates: Candidates, seed: int, options: Mapping[str, Any] | None = None,
        tuning: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(candidates, seed, options, tuning)
        self._fits: dict[tuple[int, int, str], Hyper | None] = {}
        self._weights = feature_weights(candidates.n_features, candidates.feature_groups)
        o, t = self.options, self.tuning
        self.warm = WarmStart(
            candidates, self._features, self.fitting, top=o.prior_top, paths=t.prior_paths, combine=t.prior_combine,
            patience=o.prior_patience, gain=o.min_gain, fit_iter=t.fit_iter, plateau=t.prior_plateau,
        )

    def _features(self, idx: np.ndarray, feas: bool = False) -> torch.Tensor:
        """Model inputs of candidates ``idx`` (all of them when it has their number: the
        scored pool is then every candidate, in order)."""
        src = self.candidates.xf if feas else self.candidates.x
        if len(idx) == len(src):
            return torch.as_tensor(np.asarray(src))  # shares a materialised matrix's memory
        return torch.from_numpy(np.asarray(src[idx]))

    # -- model ------------------------------------------------------------------------

    def _targets(self, history: History, transform: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
            z[sel], scale = _transform(y[sel], transform)
            noise[sel] *= scale
        return ok, z, noise

    def _marks(self, history: History, m: int) -> list[int]:
        """History lengths (up to ``m``) at which hyperparameters are refitted."""
        growth = self.tuning.refit_growth
        n0 = int((history.task == 0).sum())
        if self.tuning.warm_refit and n0 > 0 and m >= n0:
            return [n0 + c - 1 for c in checkpoints(m - n0 + 1, growth)]
        return checkpoints(m, growth)

    def _slow_labels(self, history: History) -> tuple[np.ndarray, np.ndarray] | None:
        """This study's measured candidates and whether each is within ``slow_ratio`` of
        its best; None while too few are slower to call it a regime (or the knob is off)."""
        ratio = self.tuning.slow_ratio
        own = np.flatnonzero(history.feasible & (history.task == 1) & (history.cand >= 0))
        if ratio <= 0 or len(own) < 2:
            return None
        value = history.value[own]
        fast = value <= ratio * value.min()
        slow = int((~fast).sum())
        if slow < max(SLOW_LEAST, SLOW_SHARE * len(own)):
            return None
        return history.cand[own].astype(np.int64), fast

    def _slow_inputs(self, idx: np.ndarray, xf: torch.Tensor | None = None) -> torch.Tensor:
        """The slow-regime classifier's inputs of candidates ``idx``: their feasibility
        features (``xf`` when the caller has them) plus the odd parts of their sizes."""
        xf = self._features(idx, feas=True) if xf is None else xf
        fn = self.candidates.features
        odd = fn.odd_parts(self.candidates.rows[idx]) if fn is not None else np.zeros((len(idx), 0))
        return torch.cat([xf, torch.from_numpy(odd).to(xf.dtype)], dim=1) if odd.shape[1] else xf

    def _inputs(self, history: History, rows: np.ndarray | None = None, feas: bool = False) -> np.ndarray:
        hx = history.xf if feas else history.x
        x = hx if rows is None else hx[rows]
        if self._with_task(history) and (feas or not self.warm.residual(history)):
            task = history.task if rows is None else history.task[rows]
            x = np.hstack([x, task.reshape(-1, 1).astype(np.float64)])
        return x

    @staticmethod
    def _with_task(history: History) -> bool:
        # A task column lets the GP learn how far prior data carry over (its length-scale
        # is the correlation between the old and the new pool): used, not blindly trusted.
        return bool((history.task == 0).any())

    def _fit(self, history: History, m: int, transform: str) -> tuple[Hyper | None, Hyper | None, Hyper | None]:
        """Hyperparameters of the objective's GP on ``transform``'s scale, of the
        feasibility classifier and of the slow-regime one, as last fitted at or before
        history length ``m``."""
        return self._chain(history, m, transform), self._chain(history, m, FEASIBILITY), self._chain(history, m, SLOW)

    def _chain(self, history: History, m: int, model: str) -> Hyper | None:
        """One chain of fits, each started from the one at the previous checkpoint: the
        objective's GP per scale (``model`` a transform), the classifiers (`FEASIBILITY`,
        `SLOW`) once for all scales, since their data do not depend on them. A history
        without its prior is another chain."""
        key = (m, int((history.task == 0).sum()), model)
        if key in self._fits:
            return self._fits[key]
        marks = self._marks(history, m)
        prev = marks[-2] if len(marks) > 1 and marks[-1] == m else None
        init = self._chain(history, prev, model) if prev else None
        h = history.prefix(m)
        hyper = None
        if model == FEASIBILITY:
            feas = h.feasible
            if feas.any() and not feas.all():
                hyper = fit_feasibility(self._inputs(h, feas=True), feas, init, self.tuning.fit_iter)
        elif model == SLOW:
            labelled = self._slow_labels(h)
            if labelled is not None:
                hyper = fit_feasibility(np.asarray(self._slow_inputs(labelled[0])), labelled[1], init,
                                        self.tuning.fit_iter)
        else:
            ok, z, noise = self._targets(h, model)
            if init is not None and len(init.lengthscale) != self._inputs(h, ok[:0]).shape[1]:
                init = None  # the previous fit had a task column (residual model from here on)
            if len(ok) >= 2:
                hyper = fit_hyper(self._inputs(h, ok), z, noise, init=init, max_iter=self.tuning.fit_iter)
        self._fits[key] = hyper or init
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
        design_left = 0 if has_prior else self.options.initial - feasible_current - len(pending)
        if n_current < 2 * self.options.initial and design_left > 0:
            return self._design(n, history, pending, available, rng)
        if int(history.feasible.sum()) < 2:
            return self._design(n, history, pending, available, rng)
        seeds = self.warm.seeds(history, pending, available) if has_prior else np.zeros(0, dtype=np.int64)
        if len(seeds) >= n:
            return seeds[:n]
        rest = available.copy()
        rest[seeds] = False
        taken = np.concatenate([pending, seeds])
        n_cold = self._hedged(n_current + len(taken), n - len(seeds)) if has_prior else 0
        n_ranked = 0 if has_prior else self._ranked(n_current + len(taken), n)
        n_warm = n - len(seeds) - n_cold - n_ranked
        more = self._bayes(n_warm, history, taken, rest, rng) if n_warm else np.zeros(0, dtype=np.int64)
        if n_ranked:
            rest[more] = False
            ranked = self._bayes(n_ranked, history, np.concatenate([taken, more]), rest, rng, transform=RANKS)
            more = np.concatenate([more, ranked])
        if n_cold:
            # The model's pick from this pool's results alone, as a cold study past its
            # design makes it (its generator, its chain of fits), but with the prior GP's
            # length-scales while the prior keeps its weight (prior_lengthscales: this
            # pool's first points cluster around the prior's best and say little about
            # which parameters matter); a space-filling one while fewer than two ran.
            cold = history.without_prior()
            taken = np.concatenate([taken, more])
            rest[more] = False
            crng = self.rng(cold, taken)
            if int(cold.feasible.sum()) < 2:
                cold_picks = self._design(n_cold, cold, taken, rest, crng)
            else:
                trusted = self.tuning.prior_lengthscales and self.warm.weight(history) >= SKIP_SEEDS_BELOW
                ls = self.warm.model(history)[0].hyper.lengthscale if trusted else None
                cold_picks = self._bayes(n_cold, cold, taken, rest, crng, lengthscale=ls)
            more = np.concatenate([more, cold_picks])
        return np.concatenate([seeds, more])

    def _hedged(self, first: int, n: int) -> int:
        """How many of ``n`` model picks, the first of them this study's ``first``-th own
        evaluation (counting from 0, pending ones included), are a cold study's
        (``prior_hedge``)."""
        return _every(self.tuning.prior_hedge, first, n)

    def _ranked(self, first: int, n: int) -> int:
        """How many of ``n`` model picks (``first`` as in `_hedged`) rank by a model of
        the objective's ranks (``rank_every``)."""
        return _every(self.tuning.rank_every, first, n)

    def prior_misleads(self, history: History) -> bool:
        """Whether the warm-start data are dropped (see `WarmStart.misleads`)."""
        return self.warm.misleads(history)

    def prior_dropped_after(self, history: History) -> int | None:
        return self.options.prior_patience if self.warm.misleads(history) else None

    def _design(
        self, n: int, history: History, pending: np.ndarray, available: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        chosen = history.x[history.task == 1]
        if len(pending):
            chosen = np.vstack([chosen, self.candidates.x[pending]])
        return maximin(self.candidates.x, available, chosen, n, rng, self._weights)

    def _model(
        self, history: History, lengthscale: np.ndarray | None = None, transform: str | None = None
    ) -> _Model:
        """Fit (when a checkpoint is due) and condition the models on ``history``; with
        ``lengthscale``, the objective's GP uses those length-scales instead of its fit's;
        ``transform``: `LOG` unless given."""
        transform = transform or LOG
        hyper_r, hyper_c, hyper_s = self._fit(history, self._marks(history, len(history))[-1], transform)
        ok, z, noise = self._targets(history, transform)
        residual = self.warm.residual(history)
        offset = self.warm.residual_targets(history)[3] if residual else 0.0
        width = self._inputs(history, ok[:0]).shape[1]
        if hyper_r is None or len(hyper_r.lengthscale) != width:
            # The last checkpoint had too few successes to fit (or was fitted before the
            # residual model took over): use the prior's hyperparameters.
            hyper_r = Hyper.default(width)
        if lengthscale is not None:
            hyper_r = replace(hyper_r, lengthscale=lengthscale)
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
        slow = None
        labelled = self._slow_labels(history)
        if hyper_s is not None and labelled is not None:
            slow = FeasibilityModel(np.asarray(self._slow_inputs(labelled[0])), labelled[1], hyper_s)
        cur_ok = history.task[ok] == 1
        if residual:  # in prior units: residual + prior mean + offset
            best = float((z + self.warm.mean_at_rows(history, ok) + offset).min())
        else:
            best = float(z[cur_ok].min()) if cur_ok.any() else float(z.min())
        return _Model(gp, clf, slow, residual, offset, self._with_task(history), best)

    def _bayes(
        self, n: int, history: History, pending: np.ndarray, available: np.ndarray, rng: np.random.Generator,
        lengthscale: np.ndarray | None = None, transform: str | None = None,
    ) -> np.ndarray:
        avail = available.copy()
        avail[pending] = False
        o, t = self.options, self.tuning
        pool, partial = scoring_pool(self.candidates, history, avail, rng, limit=t.max_pool, starts=t.local_starts)
        if len(pool) == 0:
            return np.zeros(0, dtype=np.int64)
        with self.fitting():
            gp, clf, slow, residual, offset, with_task, best = self._model(history, lengthscale, transform)
        power = t.feas_power

        def feats(idx: np.ndarray, feas: bool = False, x: torch.Tensor | None = None) -> torch.Tensor:
            x = self._features(idx, feas) if x is None else x
            if with_task and (feas or not residual):
                x = torch.cat([x, torch.ones(len(idx), 1, dtype=x.dtype)], dim=1)
            return x

        def score(idx: np.ndarray) -> Scores:
            mean, var = gp.predict(feats(idx))
            if residual:
                mean = mean + self.warm.mean_at_candidates(history, idx) + offset
            log_pf = torch.zeros_like(mean)
            # Both classifiers read the feasibility features: computed once per scored set.
            xf = self._features(idx, feas=True) if clf is not None or slow is not None else None
            if clf is not None:
                log_pf = torch.log(clf.prob(feats(idx, feas=True, x=xf)).clamp_min(1e-12))
            if slow is not None:
                log_pf = log_pf + torch.log(slow.prob(self._slow_inputs(idx, xf)).clamp_min(1e-12))
            return mean, var, log_pf

        mean, var, log_pf = score(pool)
        # What a new configuration's measurement may show: the model's uncertainty plus the
        # scatter of measurements around it that the model does not explain. Only for a pick
        # with nothing outstanding: a batch's picks, chosen blind to each other's results,
        # spread out by the model's variance alone (with the scatter counted, batches of 16 on
        # 4 GPUs crowded the best region; docs/decisions.md).
        misfit = o.misfit_ei * gp.noise_extra if len(pending) == 0 else 0.0
        if partial:
            pool, mean, var, log_pf = local_search(
                self.candidates, pool, (mean, var, log_pf), avail, score, best,
                power=power, rounds=t.local_rounds, starts=t.local_starts, misfit=misfit,
            )
        # Pending trials sit at the end of the scored set, believed but not selectable.
        scored = np.concatenate([pool, np.asarray(pending, dtype=np.int64)])
        if len(pending):
            m_p, v_p, l_p = score(np.asarray(pending, dtype=np.int64))
            mean, var, log_pf = torch.cat([mean, m_p]), torch.cat([var, v_p]), torch.cat([log_pf, l_p])
        xs = feats(scored)
        log_pf_w = power * log_pf
        tau = float(rng.uniform(0.0, t.tau_max))
        selectable = torch.zeros(len(scored), dtype=torch.bool)
        selectable[: len(pool)] = True
        if clf is not None or slow is not None:
            keep = selectable & (log_pf >= math.log(max(tau, 1e-12)))
            if keep.any():
                selectable = keep

        near, stall = self._near_best(history, scored, len(pending) + n)
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
        for i in range(min(n, int(selectable.sum()))):
            allowed = selectable
            # A pick's stall counts the outstanding evaluations before it as not improving,
            # so the picks of a batch alternate as one-at-a-time picks do. (Counted per
            # suggestion, a study observed an even number at a time saw stalls of one parity
            # only: with stall_every 2, it turned to the neighbourhood always or never.)
            if near and self._stalled_pick(stall + len(pending) + i):
                # The narrowest of the near sets that still has a candidate to offer.
                allowed = next((selectable & m for m in near if bool((selectable & m).any())), selectable)
            acq = log_ei(mean, believers.var + (misfit if i == 0 else 0.0), best) + log_pf_w
            acq[~allowed] = -math.inf
            j = int(torch.argmax(acq))
            picks.append(int(scored[j]))
            selectable[j] = False
            if len(picks) < n:
                believe(j)
        return np.array(picks, dtype=np.int64)

    def _near_best(self, history: History, scored: np.ndarray, picks: int) -> tuple[list[torch.Tensor], int]:
        """Masks over the scored candidates for a stalled pick, narrowest first: those
        within ``stall_radius`` moves of the best configuration that change only its
        switches (with ``stall_paths``), then all within ``stall_radius`` moves. Empty when
        there is no best, ``stall`` is off, or none of the next ``picks`` picks is stalled
        long enough. Also the study's stall."""
        o, t = self.options, self.tuning
        stall, best = _stall(history, o.min_gain)
        if o.stall <= 0 or best < 0 or stall + picks - 1 < o.stall:
            return [], stall
        rows = self.candidates.rows
        moved = rows[scored] != rows[best]
        near = moved.sum(axis=1) <= t.stall_radius
        out = [torch.as_tensor(near)]
        switches = list(self.candidates.switches)
        if t.stall_paths and switches and len(switches) < rows.shape[1]:
            sizes = np.ones(rows.shape[1], dtype=bool)
            sizes[switches] = False

            def paths(of: int) -> torch.Tensor:
                """Within stall_radius moves of ``of``, only its switches changed."""
                m = rows[scored] != rows[of]
                return torch.as_tensor((m.sum(axis=1) <= t.stall_radius) & ~m[:, sizes].any(axis=1))

            out[:0] = [paths(c) for c in [best, *_runners_up(history, rows, t.stall_radius, t.stall_leaders)]]
        return out, stall

    def _stalled_pick(self, stall: int) -> bool:
        """Whether a pick made at this stall stays near the best."""
        k = self.options.stall
        return stall >= k and (stall - k) % self.tuning.stall_every == 0


def _runners_up(history: History, rows: np.ndarray, radius: int, most: int) -> list[int]:
    """The best measured configurations of other regions, best first: each more than
    ``radius`` moves from the best and from the ones before it, within `LEADER_GAP` of the
    best; at most ``most``."""
    if most <= 0:
        return []
    cur, v = history.own_values()
    order = np.argsort(v, kind="stable")
    kept: list[int] = []
    for j in order:
        if not np.isfinite(v[j]) or v[j] > v[order[0]] * (1 + LEADER_GAP):
            break
        c = int(history.cand[cur[j]])
        if c >= 0 and all(int((rows[c] != rows[k]).sum()) > radius for k in kept):
            kept.append(c)
            if len(kept) > most:
                break
    return kept[1:]


def _stall(history: History, gain: float) -> tuple[int, int]:
    """Evaluations of this study since it last improved by more than ``gain``
    (`stopping.improvements`), and its best candidate so far."""
    cur, v = history.own_values()
    better = improvements(v, gain)
    if len(better) == 0:
        return 0, -1
    return len(cur) - 1 - int(better[-1]), int(history.cand[cur[int(np.argmin(v))]])


def _every(k: int, first: int, n: int) -> int:
    """How many of the evaluations first, ..., first + n - 1 (counting from 0) are a
    k-th one (none for k <= 0)."""
    return 0 if k <= 0 else sum(1 for i in range(first, first + n) if i % k == k - 1)


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
    if kind == RANKS:
        from scipy.special import ndtri
        from scipy.stats import rankdata

        z = ndtri((rankdata(y) - 0.5) / len(y))
        return z, float(z.std() / sd) ** 2
    return (y - y.mean()) / sd, 1.0 / sd**2
