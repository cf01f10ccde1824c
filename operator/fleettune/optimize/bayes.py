"""Bayesian optimisation over a discrete candidate set with hidden constraints.

Per suggestion (`BayesOpt.propose`), the picks are the space-filling design, a warm
start's first picks, or the model's (which pick is what: `schedule`). For the model's,
`surrogate.Surrogate` assembles one GP for log(time) on the feasible observations
(failed points enter it only as believers; every `schedule.RANK_EVERY`-th pick of a study
without a prior, a GP of the times' ranks instead), one GP classifier for feasibility and,
once a share of the results is `slow.SLOW_RATIO` times slower than the best, one for that
slow regime (`slow`), with hyperparameters refitted on a schedule of history lengths, each
fit warm-started from the previous checkpoint's fit (`fitchain`), so that a study rebuilt
from its stored history retraces the same fits and suggests the same. The acquisition
loop here (`BayesOpt._bayes`) scores the not-yet-evaluated candidates by LogEI +
`FEAS_POWER` * log P(feasible, not slow) (EI on the model's variance plus the misfit it
learned, see ``misfit_ei``), with BaCO's randomised feasibility threshold and Kriging
believers for pending trials and for the rest of a batch. After a long stall (gains
within ``min_gain`` do not end one), every other pick stays within two moves of the best
configuration, its other code paths first, then those of the best configuration of
another region almost as good (`stall`).

Warm start (prior data from another pool) is `warm.WarmStart`: the best prior
configurations and probes of other code paths first (on a prior's plateau, its best and
space-filling points of the plateau instead, `warm.PRIOR_PLATEAU`), then a residual model on top
of the prior's GP, refitted after each of this pool's first evaluations
(`fitchain.WARM_REFIT`); after the first suggestions, every `schedule.PRIOR_HEDGE`-th pick
is the model's pick from this pool's results alone (with the prior GP's length-scales,
`schedule.PRIOR_LENGTHSCALES`); a prior that leaves the study ``prior_patience``
evaluations without improvement is dropped, and from then on the study is a cold one that
keeps its own observations.

The options a TuningRun sets are declared in `BayesOptions`; the internal knobs are the
constants of the optimize modules that use them, which a development caller can change
through `BayesTuning` (`Study`'s ``tuning``). The measurements behind their values are in
docs/decisions.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .acquisition import FEAS_POWER, TAU_MAX, Believers, log_ei
from .design import DESIGN_RANDOM, design_picks, feature_weights, maximin
from .fitchain import REFIT_GROWTH, WARM_REFIT
from .gp import FIT_ITER, matern52
from .local import LOCAL_ROUNDS, LOCAL_STARTS, MAX_POOL, Scores, local_search, scoring_pool
from .options import StrategyOptions, Tuning, boolean, fixed, integer, non_negative, positive
from .problem import Candidates, History
from .schedule import DESIGN_REPLACE, PRIOR_HEDGE, PRIOR_LENGTHSCALES, RANK_EVERY, Schedule, has_prior
from .slow import SLOW_RATIO, SlowRegime
from .stall import STALL_EVERY, STALL_LEADERS, STALL_PATHS, STALL_RADIUS, StallRule
from .strategy import Strategy
from .surrogate import RANKS, Surrogate
from .warm import PRIOR_COMBINE, PRIOR_PATHS, PRIOR_PLATEAU, SKIP_FIRST_PICKS_BELOW, WarmStart


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
    design_random: bool = boolean(DESIGN_RANDOM, "A design pick is uniformly random with the probability that the "
                                  "design's points failed so far (else maximin).")
    design_replace: float = non_negative(DESIGN_REPLACE, "Failed design points are replaced up to this share of "
                                         "the design's size; 0: never.")
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
        10, "Size of the space-filling initial design, in feasible points (failed ones are replaced, up to 1.5 "
        "times this many evaluations), before the model leads. Fewer leave the model surer of a landscape it has seen "
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


class BayesOpt(Strategy):
    """The Bayesian strategy: the parts are its attributes, each a module of its own:
    ``warm`` (`warm.WarmStart`), ``slow`` (`slow.SlowRegime`), ``surrogate``
    (`surrogate.Surrogate`, with its `fitchain.FitChain`), ``stall_rule``
    (`stall.StallRule`) and ``schedule`` (`schedule.Schedule`)."""

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
        self._weights = feature_weights(candidates.n_features, candidates.feature_groups)
        o, t = self.options, self.tuning
        self.warm = WarmStart(
            candidates, self._features, self.fitting, top=o.prior_top, paths=t.prior_paths, combine=t.prior_combine,
            patience=o.prior_patience, gain=o.min_gain, fit_iter=t.fit_iter, plateau=t.prior_plateau,
        )
        self.slow = SlowRegime(candidates, self._features, t.slow_ratio)
        self.surrogate = Surrogate(self.warm, self.slow, growth=t.refit_growth, warm_refit=t.warm_refit,
                                   fit_iter=t.fit_iter)
        self.stall_rule = StallRule(candidates, after=o.stall, gain=o.min_gain, every=t.stall_every,
                                    radius=t.stall_radius, paths=t.stall_paths, leaders=t.stall_leaders)
        self.schedule = Schedule(o.initial, t.rank_every, t.prior_hedge, t.design_replace)

    def _features(self, idx: np.ndarray, feas: bool = False) -> torch.Tensor:
        """Model inputs of candidates ``idx`` (all of them when it has their number: the
        scored pool is then every candidate, in order)."""
        src = self.candidates.xf if feas else self.candidates.x
        if len(idx) == len(src):
            return torch.as_tensor(np.asarray(src))  # shares a materialised matrix's memory
        return torch.from_numpy(np.asarray(src[idx]))

    def propose(self, n: int, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        if self.prior_misleads(history):
            history = history.without_prior()
        rng = self.rng(history, pending)
        if self.schedule.designing(history, pending):
            return self._design(n, history, pending, available, rng)
        prior = has_prior(history)
        first = self.warm.first_picks(history, pending, available) if prior else np.zeros(0, dtype=np.int64)
        if len(first) >= n:
            return first[:n]
        rest = available.copy()
        rest[first] = False
        taken = np.concatenate([pending, first])
        n_log, n_ranked, n_cold = self.schedule.model_picks(
            n - len(first), int((history.task == 1).sum()) + len(taken), prior)
        more = self._bayes(n_log, history, taken, rest, rng) if n_log else np.zeros(0, dtype=np.int64)
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
                trusted = self.tuning.prior_lengthscales and self.warm.weight(history) >= SKIP_FIRST_PICKS_BELOW
                ls = self.warm.model(history)[0].hyper.lengthscale if trusted else None
                cold_picks = self._bayes(n_cold, cold, taken, rest, crng, lengthscale=ls)
            more = np.concatenate([more, cold_picks])
        return np.concatenate([first, more])

    def order_prior(self, first: np.ndarray) -> None:
        self.warm.first = first

    def prior_misleads(self, history: History) -> bool:
        """Whether the warm-start data are dropped (see `WarmStart.misleads`)."""
        return self.warm.misleads(history)

    def prior_dropped_after(self, history: History) -> int | None:
        return self.options.prior_patience if self.warm.misleads(history) else None

    def prior_weight(self, history: History) -> float | None:
        if not (history.task == 0).any():
            return None
        return 0.0 if self.warm.misleads(history) else self.warm.weight(history)

    def _design(
        self, n: int, history: History, pending: np.ndarray, available: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        own = history.task == 1
        chosen = history.x[own]
        if len(pending):
            chosen = np.vstack([chosen, self.candidates.x[pending]])
        failed_share = 1.0 - float(history.feasible[own].mean()) if own.any() else 0.0
        if not self.tuning.design_random or failed_share == 0.0:
            return maximin(self.candidates.x, available, chosen, n, rng, self._weights)
        return design_picks(self.candidates.x, available, chosen, failed_share, n, rng, self._weights)

    def _bayes(
        self, n: int, history: History, pending: np.ndarray, available: np.ndarray, rng: np.random.Generator,
        lengthscale: np.ndarray | None = None, transform: str | None = None,
    ) -> np.ndarray:
        """``n`` model picks among ``available``, not in ``pending``: each the candidate
        of highest LogEI + ``feas_power`` * log P(feasible, not slow) (`surrogate.Models`
        of ``history``; ``lengthscale`` and ``transform`` as in `Surrogate.model`), among
        those over the feasibility threshold drawn from ``rng`` (all of them where none is) and,
        for a stalled pick (`stall.StallRule`), near the best. The pending trials and a
        batch's earlier picks are Kriging believers: their mean stays, the variance they
        explain is taken off the others. Fewer picks only if fewer candidates are left."""
        avail = available.copy()
        avail[pending] = False
        o, t = self.options, self.tuning
        pool, partial = scoring_pool(self.candidates, history, avail, rng, limit=t.max_pool, starts=t.local_starts)
        if len(pool) == 0:
            return np.zeros(0, dtype=np.int64)
        with self.fitting():
            gp, clf, slow, residual, offset, with_task, best = self.surrogate.model(history, lengthscale, transform)
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
                log_pf = log_pf + torch.log(slow.prob(self.slow.inputs(idx, xf)).clamp_min(1e-12))
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

        near, stall = self.stall_rule.near_best(history, scored, len(pending) + n)
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
            if near and self.stall_rule.stalled_pick(stall + len(pending) + i):
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
