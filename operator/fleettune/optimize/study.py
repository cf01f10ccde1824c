"""The study: what the operator talks to (configurations in, configurations out)."""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fleettune.space import SearchSpace
from fleettune_job.protocol import Outcome

from .features import FeatureMap, model_features, switches
from .problem import Candidates, History, index_dtype
from .stopping import stop_reason
from .strategy import DEFAULT_STRATEGY, strategy_class

log = logging.getLogger(__name__)

MAX_ENUMERATED = 2_000_000  # beyond this, candidates are a seeded sample of the valid set
SAMPLED_CANDIDATES = 200_000

PriorObservation = tuple[dict[str, Any], Outcome, float | None]

# Candidate sets by content, while some study holds them: the studies of one space (the
# sizes of a pool, pools whose devices allow the same configurations, a rebuilt study)
# share one read-only `Candidates` instead of each keeping its own copy.
_SHARED: weakref.WeakValueDictionary[tuple[Any, ...], Candidates] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def shared_candidates(space: SearchSpace, rows: np.ndarray) -> Candidates:
    """The candidate set of ``rows`` in ``space`` (features computed from the space's
    parameters), the same object for every study with equal parameters and rows."""
    params = space.parameters
    if rows.dtype.kind not in "iu":
        rows = rows.astype(np.int32)
    if not params:  # a space without parameters: its own encoding, not shared
        x, xf, groups = model_features(space, rows)
        return Candidates(rows, x, groups, xf, switches(space))
    rows = np.ascontiguousarray(rows, dtype=index_dtype(rows))  # what Candidates keeps: equal sets, equal keys
    digest = hashlib.blake2b(rows.data, digest_size=20).hexdigest()
    key = (tuple((p.name, p.type, p.scale, repr(p.values)) for p in params), rows.shape, str(rows.dtype), digest)
    with _SHARED_LOCK:
        found = _SHARED.get(key)
    if found is not None:
        return found
    fmap = FeatureMap(space)
    made = Candidates(rows, None, list(fmap.groups), None, switches(space), features=fmap)
    with _SHARED_LOCK:
        return _SHARED.setdefault(key, made)


def log_noise(objective: float, times: Sequence[float]) -> float:
    """Variance of log(mean time) estimated from the repeats (0 without repeats)."""
    t = np.asarray([v for v in times if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(t) < 2 or objective <= 0:
        return 0.0
    return float(t.var(ddof=1) / len(t) / objective**2)


class Study:
    """One optimisation (one pool, one problem size) over a search space.

    Deterministic for a seed; a Study rebuilt and fed the same history in the same order
    suggests the same next configurations. Not bound to a thread, holds no global
    state; a lock makes concurrent calls on one study safe.
    """

    def __init__(
        self,
        space: SearchSpace,
        strategy: str = DEFAULT_STRATEGY,
        seed: int = 0,
        candidates: np.ndarray | None = None,
        prior: Iterable[PriorObservation] = (),
        options: Mapping[str, Any] | None = None,
        *,
        prior_first: Sequence[Mapping[str, Any]] = (),
        tuning: Mapping[str, Any] | None = None,
    ) -> None:
        """``options``: the strategy's (a TuningRun's ``spec.strategy.options``).
        ``prior_first``: configurations of ``prior`` that a warm start measures first, in
        this order (the operator's: the consensus of earlier runs on other GPUs,
        `controller.memory.first_picks`); after them, and by default, the prior's fastest
        first (times relative to their group's best). ``tuning``: its internal knobs
        (`Strategy.Tuning`), a development hook for benchmarks and tests; the operator never
        passes it."""
        factory = strategy_class(strategy)  # UnknownStrategyError
        self.space = space
        self.strategy_name = strategy
        self.seed = int(seed)
        if candidates is None:
            candidates = self._default_candidates(space, self.seed)
        self.candidates = shared_candidates(space, np.asarray(candidates))
        self.strategy = factory(self.candidates, self.seed, options, tuning)  # OptionError
        if prior_first:
            self.strategy.order_prior(self._candidates_of(prior_first))
        # Wall time the strategy spent fitting its models during the last `suggest`
        # (hyperparameters when a refit is due, and conditioning the models on the data;
        # not scoring the candidates); None when it fitted nothing (random, genetic, the
        # initial design).
        self.last_fit_seconds: float | None = None
        self.history = History.empty(self.candidates.n_features, self.candidates.xf.shape[1])
        self._observed = np.zeros(len(self.candidates), dtype=bool)
        self._lock = threading.Lock()
        self._rows: list[np.ndarray] = []  # index row of each observation, for decoding
        self.n_prior = 0
        for config, outcome, objective in prior:
            try:
                self._record(config, Outcome(outcome), objective, (), task=0)
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                # Prior data come from another driver or pool and may not fit this space
                # (a parameter renamed, a value dropped): skip them, never fail the study.
                log.debug("skipping prior observation %r: %s", config, exc)
                continue
            self.n_prior += 1

    def _candidates_of(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """The candidate numbers of ``configs``, in order, those of another space left out."""
        out: list[int] = []
        for config in configs:
            try:
                row = self._row(config)
            except (ValueError, KeyError, IndexError, TypeError):
                continue
            if (cand := int(self.candidates.lookup(row)[0])) >= 0:
                out.append(cand)
        return np.asarray(out, dtype=np.int64)

    def _row(self, config: Mapping[str, Any]) -> np.ndarray:
        """The index row (1 x d) of ``config``; raises where it is not of this space."""
        return np.asarray(self.space.to_rows([dict(config)]), dtype=np.int32).reshape(1, -1)

    @staticmethod
    def _default_candidates(space: SearchSpace, seed: int) -> np.ndarray:
        if space.count() <= MAX_ENUMERATED:
            sizes = space.sizes
            if sizes:  # rows as narrow as the candidates will keep them: no int32 copy on the way
                return np.asarray(space.enumerate(dtype=index_dtype(np.asarray([max(sizes) - 1]))))
            return np.asarray(space.enumerate())
        return np.asarray(space.sample(SAMPLED_CANDIDATES, np.random.default_rng([seed, 0xCA4D]), distinct=True))

    # -- observations -----------------------------------------------------------------

    def _record(
        self, config: dict[str, Any], outcome: Outcome, objective: float | None, times: Sequence[float], task: int
    ) -> None:
        if outcome == Outcome.INFRA_ERROR:
            raise ValueError("infrastructure failures are not observations of the configuration; retry the trial")
        if outcome == Outcome.OK:
            if objective is None or not math.isfinite(objective) or objective <= 0:
                raise ValueError(f"an ok outcome needs a positive objective, got {objective!r}")
            value, noise = float(objective), log_noise(float(objective), times)
        else:
            value, noise = math.nan, 0.0
        row = self._row(config)
        cand = int(self.candidates.lookup(row)[0])
        if cand >= 0:
            x, xf = self.candidates.x[cand], self.candidates.xf[cand]
        elif self.candidates.features is not None:
            x, xf = self.candidates.features(row)[0], self.candidates.features(row, feas=True)[0]
        else:
            x, xf, _ = model_features(self.space, row)
            x, xf = x[0], xf[0]
        self.history.append(x, xf, cand, value, noise, outcome, task)
        self._rows.append(row[0])
        if cand >= 0 and task == 1:
            self._observed[cand] = True

    def observe(
        self,
        config: dict[str, Any],
        outcome: Outcome,
        objective: float | None = None,
        times: Sequence[float] = (),
    ) -> None:
        """Record one finished trial. ``objective`` in ms for ``Outcome.OK``."""
        with self._lock:
            self._record(config, Outcome(outcome), objective, times, task=1)

    # -- suggestions ------------------------------------------------------------------

    def suggest(self, n: int = 1, pending: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """``n`` distinct configurations, never observed and not pending (fewer only when
        the candidates run out)."""
        with self._lock:
            self.last_fit_seconds = self.strategy.fit_seconds = None
            pend = np.zeros(0, dtype=np.int64)
            if pending:
                rows = np.asarray(self.space.to_rows(list(pending)), dtype=np.int32)
                pend = self.candidates.lookup(rows)
                pend = np.unique(pend[pend >= 0])
            available = ~self._observed
            available[pend] = False
            want = min(int(n), int(available.sum()))
            if want <= 0:
                return []
            try:
                picks = [int(c) for c in self.strategy.propose(want, self.history, pend, available)]
            except (np.linalg.LinAlgError, RuntimeError, ValueError) as exc:
                # A numerical failure of the model must not stall a tuning run: this
                # round falls back to random candidates, the next one tries the model again.
                log.warning("strategy %s failed (%s); suggesting random candidates", self.strategy_name, exc)
                picks = []
            finally:
                self.last_fit_seconds = self.strategy.fit_seconds
            out: list[int] = []
            for c in picks:  # defensive: a strategy bug must not produce duplicates
                if 0 <= c < len(available) and available[c] and c not in out:
                    out.append(c)
            if len(out) < want:
                rest = np.flatnonzero(available)
                rest = rest[~np.isin(rest, out)]
                rng = np.random.default_rng([self.seed, len(self.history), 0xF111])
                out.extend(int(c) for c in rng.permutation(rest)[: want - len(out)])
            return list(self.space.to_configs(self.candidates.rows[np.array(out[:want])]))

    # -- state ------------------------------------------------------------------------

    def _current_values(self) -> np.ndarray:
        return self.history.value[self.history.task == 1]

    @property
    def learns(self) -> bool:
        """Whether the strategy's suggestions depend on the results observed (`Strategy.learns`)."""
        return self.strategy.learns

    @property
    def n_observed(self) -> int:
        return int((self.history.task == 1).sum())

    @property
    def n_invalid(self) -> int:
        return int(((self.history.task == 1) & ~self.history.feasible).sum())

    @property
    def prior_dropped(self) -> bool:
        """Whether the strategy has stopped using the warm-start data (it misled the search)."""
        return self.prior_dropped_after is not None

    @property
    def prior_dropped_after(self) -> int | None:
        """When the strategy has stopped using the warm-start data: after how many
        evaluations without improvement it did (None while it uses them or has none)."""
        if not self.n_prior:
            return None
        return self.strategy.prior_dropped_after(self.history)

    @property
    def prior_weight(self) -> float | None:
        """How much the strategy's model uses the warm-start data now (`Strategy.prior_weight`)."""
        return self.strategy.prior_weight(self.history) if self.n_prior else None

    @property
    def best(self) -> tuple[dict[str, Any], float] | None:
        mine = np.flatnonzero((self.history.task == 1) & self.history.feasible)
        if len(mine) == 0:
            return None
        i = mine[int(np.argmin(self.history.value[mine]))]
        config = self.space.to_configs(self._rows[i].reshape(1, -1))[0]
        return config, float(self.history.value[i])

    @property
    def exhausted(self) -> bool:
        """Whether every candidate has been observed."""
        return not (~self._observed).any()

    def should_stop(
        self,
        budget: int | None = None,
        patience: int | None = None,
        target: float | None = None,
        deadline_s: float | None = None,
        elapsed_s: float = 0.0,
    ) -> str | None:
        """Reason to stop ("exhausted", "budget", "target", "patience", "deadline") or None
        (see `stopping.stop_reason`; ``elapsed_s``: seconds since the round started)."""
        return stop_reason(
            self._current_values(),
            budget=budget,
            patience=patience,
            target=target,
            deadline_s=deadline_s,
            elapsed_s=elapsed_s,
            exhausted=self.exhausted,
        )
