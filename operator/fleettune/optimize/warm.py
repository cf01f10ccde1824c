"""Warm start of the Bayesian strategy from prior data (task 0 of the history: the
results of another pool, driver or problem size).

The best prior configurations are measured first, then probes of the other code paths
the prior may have wrongly ruled out (`WarmStart.path_probes`) and the prior best's two
helping moves combined (`WarmStart.combination`), with a few space-filling points among
them; where the prior rates a large share of the space within 5 % of its best (a
plateau), its best and space-filling points on the plateau instead (`WarmStart.plateau`);
then this pool's log times are modelled as the prediction of a GP
fitted to the prior alone, shifted by their mean offset, plus a residual GP fitted to
this pool's data (the "residual" warm model).

How much of the prior's shape the model uses is earned from this pool's own results
(`trust.PriorTrust`): the prior's prediction is scaled by a weight in [0, 1] that
follows the rank correlation between what the prior predicts at this pool's measured
points and what this pool measured there; once the weight falls low, the study stops
measuring the prior's picks and completes a cold study's space-filling design instead
(`WarmStart.design`). A prior that leaves the study ``patience`` evaluations without
improvement (of more than ``gain``, `stopping.improvements`) is dropped altogether
(`WarmStart.misleads`).

Why checked rather than trusted, and the measurements behind these choices: see
docs/decisions.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager

import numpy as np
import torch

from .design import feature_weights, maximin
from .gp import PREDICT_CHUNK, Posterior, fit_hyper
from .problem import Candidates, History
from .stopping import improvements
from .trust import PriorTrust

# The trust rule of every warm study (frozen, so one instance serves all; `PriorTrust`).
DEFAULT_TRUST = PriorTrust()

# Below this weight (`PriorTrust`), a warm study stops measuring the prior's best
# configurations and probes and lets the model choose.
SKIP_FIRST_PICKS_BELOW = 0.5
# A distrusted prior's study completes a space-filling design of this many feasible
# points of its own, as a cold one does (BayesOptions.initial's default).
DESIGN = 10
# After the prior's best, a warm study measures this many space-filling points: what the
# prior rates best cannot show on its own whether the prior's ranking holds here.
CONTRAST = 3
# A prior's plateau: the candidates its GP predicts within this fraction of its best.
PLATEAU_LEVEL = 0.95
# On a plateau, after the prior's best, a warm study measures this many space-filling
# points of the plateau (`WarmStart.plateau`).
PLATEAU_DESIGN = 3
# The prior's plateau counts (`WarmStart.plateau`) when it holds at least this share of the
# candidates: an NVIDIA GPU's dedispersion plateau holds 14-42 %, no other recorded prior's
# comes near 2 % (0: never; the tuning knob ``prior_plateau``).
PRIOR_PLATEAU = 0.02
# After the prior's best, probe this many other code paths, two configurations each, and
# the prior model's best on as many more (`WarmStart.path_probes`; ``prior_paths``).
PRIOR_PATHS = 3
# Once the prior's best and the first code path's probes are measured, measure the prior's
# best with its two helping moves applied together (`WarmStart.combination`;
# ``prior_combine``).
PRIOR_COMBINE = True


def _none() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


class WarmStart:
    """The prior-data part of a `BayesOpt`: the prior's own GP (fitted once: the prior
    does not change), the first suggestions of a warm study, how much the model weighs
    the prior (`weight`, by ``trust``), and when to drop it.

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
        combine: bool,
        patience: int,
        gain: float,
        fit_iter: int,
        plateau: float = 0.0,
        trust: PriorTrust | None = DEFAULT_TRUST,
    ) -> None:
        self.candidates = candidates
        self._features = features
        self._fitting = fitting
        self.top, self.paths, self.combine, self.patience, self.gain = top, paths, combine, patience, gain
        self.fit_iter = fit_iter
        self.plateau_share = plateau  # 0: never (see `plateau`)
        self.trust = trust  # None: the prior keeps its full weight (no earned weight)
        self._prior: tuple[int, Posterior, float, float] | None = None
        self._prior_cand: torch.Tensor | None = None
        self._paths: tuple[np.ndarray, np.ndarray] | None = None  # code-path keys, path of each candidate
        self._plateau: tuple[int, np.ndarray] | None = None  # prior size, candidates on the prior's plateau
        self._weights: dict[tuple[int, int], float] = {}
        self.first = np.zeros(0, dtype=np.int64)  # candidates to measure first (`BayesOpt.order_prior`)

    # -- the residual model -------------------------------------------------------------

    def residual(self, history: History) -> bool:
        """Whether this pool is modelled as the prior's prediction plus a residual GP: once
        the prior has two results that ran and this pool one (before, one GP with a task
        column models both)."""
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
        """The prior's part of the residual model at candidates ``idx`` (all of them by
        default): the prior GP's mean times `weight`."""
        mean = self._prior_mean(history, idx)
        w = self.weight(history)
        return mean if w == 1.0 else mean * w

    def mean_at_rows(self, history: History, rows: np.ndarray) -> np.ndarray:
        """The prior's part of the residual model at the history's ``rows``: the prior
        GP's mean times `weight`."""
        mean = self._prior_mean_at_rows(history, rows)
        w = self.weight(history)
        return mean if w == 1.0 else mean * w

    def _prior_mean(self, history: History, idx: np.ndarray | None = None) -> torch.Tensor:
        """The prior GP's mean at candidates ``idx`` (all of them by default; cached)."""
        gp, _, _ = self.model(history)
        if self._prior_cand is None:
            # Chunk by chunk (the chunks `predict` would make): no (N, f) matrix of all candidates.
            n, step = len(self.candidates), PREDICT_CHUNK
            parts = [gp.predict(self._features(np.arange(s, min(n, s + step))))[0] for s in range(0, n, step)]
            self._prior_cand = torch.cat(parts)
        return self._prior_cand if idx is None else self._prior_cand[torch.as_tensor(idx)]

    def _prior_mean_at_rows(self, history: History, rows: np.ndarray) -> np.ndarray:
        gp, _, _ = self.model(history)
        return gp.predict(torch.as_tensor(history.x[rows]), fast=False)[0].numpy()

    def weight(self, history: History) -> float:
        """The prior's weight in the residual model for ``history`` (`PriorTrust`; 1
        without a trust rule). A function of the history alone, so that a study rebuilt
        from it weighs the prior the same."""
        if self.trust is None or int((history.feasible & (history.task == 0)).sum()) < 2:
            return 1.0  # no prior model to weigh (see `residual`)
        key = (len(history), int((history.task == 0).sum()))  # a study's histories only grow
        if key not in self._weights:
            own, values = history.own_values()
            if len(own) < self.trust.min_points:
                return 1.0
            prior = self._prior_mean_at_rows(history, own)
            self._weights[key] = self.trust.weight(prior, np.log(values))
        return self._weights[key]

    def residual_targets(self, history: History) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """This pool's feasible points: their log times on the prior's scale minus the
        prior's (weighted) prediction, centred (the mean offset is returned separately)."""
        _, mu, sd = self.model(history)
        ok = np.flatnonzero(history.feasible & (history.task == 1))
        z = (np.log(history.value[ok]) - mu) / sd
        r = z - self.mean_at_rows(history, ok)
        offset = float(r.mean())
        return ok, r - offset, history.noise[ok] / sd**2, offset

    # -- when to drop the prior ---------------------------------------------------------

    def misleads(self, history: History) -> bool:
        """Whether this study, with prior data, has at some point gone ``patience``
        evaluations without improving by more than ``gain``: from then on the prior is
        dropped.

        The residual model trusts the prior's shape wherever this pool has no data, so a
        prior whose good region is bad here can hold the search in it, while a cold start
        would get past it."""
        k = self.patience
        if k <= 0 or not (history.task == 0).any():
            return False
        _, v = history.own_values()
        if len(v) <= k:
            return False
        gaps = np.diff(np.concatenate([[0], improvements(v, self.gain), [len(v)]]))
        return bool(gaps.max() > k)

    # -- the first suggestions of a warm study ------------------------------------------

    def first_picks(self, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        """While this study has measured fewer than ``top`` points, the contrast and the
        probes of other code paths: the ``top`` best prior configurations, the first code
        path's two probes (`path_probes`), the combination of the prior best's improving
        moves (`combination`, with ``combine``), `CONTRAST` space-filling points, the other
        probes. Once the prior has lost its weight (`PriorTrust`): the rest of a cold
        study's design instead (`design`).

        A driver update rarely reshuffles the top of a landscape, and measuring it here
        is how the prior gets checked rather than trusted. The probes come second: put
        first, they delay the warm starts whose prior's top is already right here. The
        contrast points give the rank correlation something the prior does not rate best
        to compare with: among the prior's favourites alone, a prior that points the
        wrong way looks no different from one that is right."""
        if self.weight(history) < SKIP_FIRST_PICKS_BELOW:
            return self.design(history, pending, available)
        plateau = self.plateau(history)
        if plateau is not None:
            return self._plateau_picks(history, plateau, pending, available)
        n_current = int((history.task == 1).sum()) + len(pending)
        contrast = CONTRAST if self.trust is not None else 0
        if n_current >= self.top + contrast + 3 * self.paths + 1:  # path_probes: at most 3 * paths; combination: 1
            return _none()
        order = self._prior_order(history)
        if len(order) == 0:
            return _none()
        probes = self.path_probes(history, int(order[0]))
        budget = self.top + contrast + len(probes) - n_current
        out: list[int] = []

        def walk(picks: np.ndarray, limit: int) -> None:
            for c in picks:
                if len(out) >= limit:
                    break
                if available[c] and c not in pending and c not in out:
                    out.append(int(c))

        first = min(2, len(probes))  # the first code path's probes, then the contrast
        combo = self.combination(history, int(order[0]), self.top + first) if self.combine else None
        if combo is not None and (combo in order[: self.top] or combo in probes[:first]):
            combo = None
        extra = int(combo is not None)
        budget += extra
        walk(order[: self.top], budget)
        walk(probes[:first], budget)
        if combo is not None:  # only once the prior's best and these probes are measured
            walk(np.array([combo]), budget)
        left = contrast - max(0, n_current - self.top - first - extra)
        if left > 0 and len(out) < budget:
            free = available.copy()
            free[np.asarray(out, dtype=np.int64)] = False
            taken = np.concatenate([np.asarray(pending, dtype=np.int64), np.asarray(out, dtype=np.int64)])
            out.extend(int(c) for c in self._maximin(history, taken, free, min(left, budget - len(out))))
        walk(np.concatenate([probes, order[self.top :]]), budget)
        return np.array(out, dtype=np.int64)

    def _prior_order(self, history: History) -> np.ndarray:
        """The candidates the prior ran: ``first`` (those of them it ran) in their order,
        then the others fastest first."""
        prior = np.flatnonzero((history.task == 0) & history.feasible & (history.cand >= 0))
        order = history.cand[prior[np.argsort(history.value[prior], kind="stable")]]
        if len(self.first) == 0:
            return order
        first = self.first[np.isin(self.first, order)]
        return np.concatenate([first, order[~np.isin(order, first)]])

    def plateau(self, history: History) -> np.ndarray | None:
        """The candidates the prior GP predicts within `PLATEAU_LEVEL` of its best, when
        they are at least the share ``plateau_share`` of all candidates; else None.

        Where that many configurations are about as fast as the prior's best (a
        dedispersion kernel on an NVIDIA GPU: 5 to 40 % of the space within 5 %), which of
        them another GPU runs fastest is not in the prior: the order of its next best, and
        of its code paths' bests, is within its own noise. The prior still tells where the
        fast configurations are: on the benchmark hub's AMD GPUs, each one within 0.95 of
        the optimum sits on the NVIDIA GPUs' plateau. So a warm study measures the prior's
        best, then space-filling points of the plateau, which show the model how the
        plateau differs here, instead of the prior's next best, probes and contrast
        points. The recorded spaces of the other families have at most 0.8 % of their
        candidates on their plateau (docs/decisions.md)."""
        if self.plateau_share <= 0:
            return None
        n0 = int((history.task == 0).sum())
        if self._plateau is None or self._plateau[0] != n0:
            mean = self._prior_mean(history).numpy()
            _, _, sd = self.model(history)
            on = mean <= mean.min() + math.log(1 / PLATEAU_LEVEL) / sd  # log times, on the prior's z scale
            self._plateau = (n0, on)
        on = self._plateau[1]
        return on if on.mean() >= self.plateau_share else None

    def _plateau_picks(self, history: History, plateau: np.ndarray, pending: np.ndarray,
                       available: np.ndarray) -> np.ndarray:
        """A warm study's first suggestions on a prior's `plateau`: the prior's best, then
        `PLATEAU_DESIGN` space-filling points of the plateau."""
        n_current = int((history.task == 1).sum()) + len(pending)
        if n_current >= 1 + PLATEAU_DESIGN:
            return _none()
        order = self._prior_order(history)
        out: list[int] = []
        if n_current == 0 and len(order):
            best = int(order[0])
            if available[best] and best not in pending:
                out.append(best)
        free = available & plateau
        free[np.asarray(out, dtype=np.int64)] = False
        taken = np.concatenate([np.asarray(pending, dtype=np.int64), np.asarray(out, dtype=np.int64)])
        out.extend(int(c) for c in self._maximin(history, taken, free, 1 + PLATEAU_DESIGN - n_current - len(out)))
        return np.array(out, dtype=np.int64)

    def combination(self, history: History, best: int, among: int) -> int | None:
        """The prior's best configuration ``best`` with the moves of its two fastest
        one-move variants applied together, when both variants measured faster than it
        here, among this study's first ``among`` measurements (the prior's best and the
        first code path's probes); None until they are all measured, or when there is no
        such pair or no such candidate. Fixed by those measurements, so a study makes at
        most one such pick, in batches too.

        Another GPU often moves the optimum by two changes that each help only a little
        alone (a wider vector, and no staging through shared memory), together much more.
        The residual model cannot see it: the prior rates the combination low, and this
        pool has measured each change only without the other. It is the pattern move of a
        coordinate search, taken once, where the prior's top tells which moves to try."""
        own = np.flatnonzero(history.task == 1)[:among]
        if len(own) < among:
            return None
        own = own[history.feasible[own] & (history.cand[own] >= 0)]
        at = own[history.cand[own] == best]
        if len(at) == 0:
            return None
        rows = self.candidates.rows
        base, t0 = rows[best], float(history.value[at[0]])
        moves: list[tuple[float, int, int]] = []
        for i in own:
            diff = np.flatnonzero(rows[history.cand[i]] != base)
            if len(diff) == 1 and history.value[i] < t0:
                moves.append((float(history.value[i]), int(diff[0]), int(rows[history.cand[i], diff[0]])))
        moves.sort()
        other = [m for m in moves[1:] if m[1] != moves[0][1]] if moves else []
        if not other:
            return None
        moved = base.copy()
        for _, col, value in (moves[0], other[0]):
            moved[col] = value
        c = int(self.candidates.lookup(moved)[0])
        return c if c >= 0 else None

    def design(self, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        """Once the prior has lost its weight: the rest of a cold study's space-filling
        design (`DESIGN` feasible points of this study's own, at most twice as many
        evaluations), maximin from what this study has measured and has pending.

        The prior's picks measured so far sit where the prior was wrong; without points
        spread over the space the model would extrapolate from that corner alone, and
        the rank correlation of the prior would be judged on it too."""
        own = history.task == 1
        left = DESIGN - int((history.feasible & own).sum()) - len(pending)
        if left <= 0 or int(own.sum()) + len(pending) >= 2 * DESIGN:
            return _none()
        return self._maximin(history, pending, available, left)

    def _maximin(self, history: History, pending: np.ndarray, available: np.ndarray, n: int) -> np.ndarray:
        """``n`` space-filling picks away from this study's measured and pending points."""
        own = history.task == 1
        pending = np.asarray(pending, dtype=np.int64)
        chosen = history.x[own]
        if len(pending):
            chosen = np.vstack([chosen, self.candidates.x[pending]])
        # Deterministic in the history (a rebuilt study picks the same), varied by it.
        rng = np.random.default_rng([len(history), len(pending), int(history.cand[own].sum()) % 2**32, 0xD5])
        weights = feature_weights(self.candidates.n_features, self.candidates.feature_groups)
        return maximin(self.candidates.x, available, chosen, n, rng, weights)

    def path_probes(self, history: History, best: int) -> np.ndarray:
        """Two probes in each of the ``paths`` code paths (`features.switches`) other
        than ``best``'s whose best is predicted fastest: ``best`` moved onto the path,
        and the prior model's best there; then the prior model's best on each of the
        next ``paths`` paths.

        A new GPU often favours another code path (shared memory or not, another block
        shape): sometimes the prior's best with the path switched is the good probe,
        sometimes the prior model's best on that path. Either shows the residual model
        where the prior is wrong. The paths the prior ranks next get one probe each: where
        it predicts several paths' bests within a few per cent of each other, which of
        them it ranks first is its noise, and another GPU's fast path can be fourth."""
        k = self.paths
        cols = list(self.candidates.switches)
        if k <= 0 or not cols:
            return _none()
        keys, path = self._code_paths(cols)
        mean = self._prior_mean(history).numpy().copy()
        mean[history.cand[(history.task == 0) & ~history.feasible & (history.cand >= 0)]] = np.inf
        order = np.argsort(mean, kind="stable")
        _, first = np.unique(path[order], return_index=True)
        leaders = order[first]  # the predicted best of each path
        leaders = leaders[np.isfinite(mean[leaders]) & (path[leaders] != path[best])]
        ranked = leaders[np.argsort(mean[leaders], kind="stable")]
        out: list[int] = []
        for c in ranked[:k]:
            moved = self.candidates.rows[best].copy()
            moved[cols] = keys[path[c]]
            for probe in (int(self.candidates.lookup(moved)[0]), int(c)):
                if probe >= 0 and probe not in out:
                    out.append(probe)
        out.extend(int(c) for c in ranked[k : 2 * k])
        return np.array(out, dtype=np.int64)

    def _code_paths(self, cols: list[int]) -> tuple[np.ndarray, np.ndarray]:
        if self._paths is None:
            keys, path = np.unique(self.candidates.rows[:, cols], axis=0, return_inverse=True)
            self._paths = (keys, path.reshape(-1).astype(np.int32))
        return self._paths
