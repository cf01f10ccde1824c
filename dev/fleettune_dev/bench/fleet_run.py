"""The replays of `fleettune bench fleet`: N recordings of one kernel tuned as the pools of
one TuningRun, and what each pool and the fleet spent to reach a level.

`lockstep` advances the pools in rounds: every round each pool in turn (GPU order) is
given its next batch, then all the round's results arrive, pool by pool in GPU order. A
batch is one suggestion (``batch`` 1) or, as the operator's Pods are, ``batch`` ramped up
by `slow_start` while results are few. Independent pools keep one cold `Study` each, so a
pool's replay is `bench.strategy.run_once` (``batch`` 1) or `run_batched` with one GPU.
Sharing pools get, as the operator's do, a `Study` rebuilt with every other pool's
results so far as ``prior=`` (`shared_prior`) whenever those have grown by a quarter
(`controller.memory.refresh_due`), and their own results observed again: the warm-start
machinery applied live, prior dropped where it misleads (``prior_patience``)
included. A pool never waits: what another pool measures in a round reaches it at the next.

`sequential` tunes the pools one after another, each with every earlier pool's full
results as ``prior=``.

Costs: a configuration's GPU-seconds are its recorded verification + benchmark time, 0
where it failed to compile (the GPU critical path `bench timeline` counts; compilation
runs on the node's CPUs). A recording without those fields has no costs (None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleettune_dev.bench.replay import FAILURE_OUTCOME, Replay, load_replay, restrict
from fleettune_job.protocol import Outcome

LEVELS = (0.95, 0.99)

Observation = tuple[dict[str, Any], Outcome, float | None]


class Prior(NamedTuple):
    """A study's warm-start data as the operator hands it over: the observations (times
    relative to their group's best) and the configurations measured first
    (`controller.memory.first_picks`)."""

    observations: list[Observation]
    first: list[dict[str, Any]]


@dataclass
class Pool:
    """One GPU's recording and what each of its configurations cost (seconds; None: not recorded)."""

    replay: Replay
    gpu_s: np.ndarray | None = None

    @property
    def name(self) -> str:
        return self.replay.name.removesuffix(".gz").removesuffix(".json")


def load_pool(path: str | Path, where: Sequence[str] = ()) -> Pool:
    """The recording at ``path`` with its costs, restricted by ``where`` (`replay.restrict`).
    `SpaceError` (a ValueError) when it is no Kernel Tuner cache."""
    from fleettune.space.errors import SpaceError
    from fleettune_dev.bench.timeline.model import load_timed_space

    try:
        timed = load_timed_space(path)
    except SpaceError:
        raise
    except ValueError:  # a cache without cost fields: replayed, its GPU-seconds null
        replay = load_replay(path)
        return Pool(restrict(replay, where) if where else replay, None)
    gpu_s = timed.gpu_s()
    if not where:
        return Pool(timed.replay, gpu_s)
    small = restrict(timed.replay, where)
    cost = {tuple(r): float(s) for r, s in zip(timed.replay.rows.tolist(), gpu_s, strict=True)}
    return Pool(small, np.array([cost[tuple(r)] for r in small.rows.tolist()]))


@dataclass
class PoolTrace:
    """One pool's replay: its evaluations in the order observed."""

    cand: list[int] = field(default_factory=list)  # recording index of each evaluation
    rounds: list[int] = field(default_factory=list)  # round of each (0-based)
    observations: list[Observation] = field(default_factory=list)
    budget: int = 0  # evaluations it was allowed (the budget, or fewer where the recording is smaller)
    # Each evaluation's GPU-seconds (recording indices; None: no costs).
    cost_of: np.ndarray | None = None

    def best(self, optimum: float) -> np.ndarray:
        """Fraction of ``optimum`` reached after each evaluation (0 before any success),
        ``budget`` long: a run stopped early keeps its last value."""
        out = np.zeros(self.budget)
        current = 0.0
        for i, (_, outcome, value) in enumerate(self.observations[: self.budget]):
            if outcome == Outcome.OK and value:
                current = max(current, optimum / value)
            out[i] = current
        out[len(self.observations):] = current
        return out

    def evals_to(self, optimum: float, level: float) -> int:
        """1-based evaluation that first reaches ``level`` of ``optimum``; budget + 1 if none."""
        hit = self.best(optimum) >= level - 1e-12
        return int(np.argmax(hit)) + 1 if hit.any() else self.budget + 1

    def seconds(self, n: int | None = None) -> float | None:
        """GPU-seconds of the first ``n`` evaluations (all of them by default)."""
        if self.cost_of is None:
            return None
        return float(self.cost_of[self.cand[:n]].sum()) if self.cand else 0.0

    def seconds_in_rounds(self, last: int) -> float | None:
        """GPU-seconds of the evaluations of rounds ``0..last``."""
        if self.cost_of is None:
            return None
        return float(sum(self.cost_of[c] for c, r in zip(self.cand, self.rounds, strict=True) if r <= last))


def observe(pool: Pool, study: Any, config: dict[str, Any], trace: PoolTrace) -> None:
    """Evaluate ``config`` on the recording (`bench.strategy`'s replay protocol), observe it
    on ``study`` (None: only record it) and append it to ``trace``."""
    replay = pool.replay
    c = int(replay_lookup(study, replay, config))
    t = replay.time_ms[c]
    if math.isfinite(t):
        obs: Observation = (config, Outcome.OK, float(t))
    else:
        obs = (config, FAILURE_OUTCOME.get(replay.failure[c] or "runtime", Outcome.RUNTIME_ERROR), None)
    if study is not None:
        study.observe(obs[0], obs[1], obs[2], replay.times[c] if obs[2] is not None else ())
    trace.cand.append(c)
    trace.observations.append(obs)


def replay_lookup(study: Any, replay: Replay, config: dict[str, Any]) -> int:
    return int(study.candidates.lookup(np.asarray(replay.space.to_rows([config]), dtype=np.int32))[0])


class PriorBuilder:
    """Other pools' observations as one pool's ``prior=``, as the operator's
    `warm_start_prior` assembles a warm start: one group per other pool, in GPU order, each
    in the order its results arrived, times divided by the group's best (another GPU's
    times are at another speed; only how much slower than the best carries over), only
    configurations valid in the receiving pool's space."""

    def __init__(self, pools: Sequence[Pool]) -> None:
        self.pools = pools
        self._valid: dict[tuple[int, tuple[Any, ...]], bool] = {}

    def groups(self, receiver: int, sources: Sequence[Sequence[Observation]], *, finished: bool = True) -> Prior:
        """``sources``: one group of observations per other pool (each another GPU);
        ``finished``: as an earlier run's, which may make a consensus to measure first
        (`controller.memory.first_picks`), not a pool still tuning."""
        from fleettune.controller.memory import first_picks
        from fleettune.controller.pool import relative_prior
        from fleettune.space.errors import SpaceError

        space = self.pools[receiver].replay.space

        def valid(config: dict[str, Any]) -> bool:
            # Every pool's study is rebuilt many times: each configuration is checked once.
            key = (receiver, tuple(config.values()))
            if key not in self._valid:
                try:
                    self._valid[key] = bool(space.is_valid(space.to_rows([config]))[0])
                except SpaceError:
                    self._valid[key] = False
            return self._valid[key]

        kept = [relative_prior([group], valid) for group in sources]
        first = first_picks([], [group for group in kept if group]) if finished else []
        return Prior([o for group in kept for o in group], first)

    def shared(self, receiver: int, traces: Sequence[PoolTrace], before: int) -> Prior:
        """Every other pool's results of the rounds before ``before``."""
        sources = []
        for j, tr in enumerate(traces):
            if j == receiver:
                continue
            n = sum(1 for r in tr.rounds if r < before)  # rounds are non-decreasing
            if n:
                sources.append(tr.observations[:n])
        return self.groups(receiver, sources, finished=False)


def lockstep(
    pools: Sequence[Pool], strategy: str, seed: int, budget: int, batch: int = 1, *, share: bool = False,
    priors: Sequence[Prior] | None = None, options: dict[str, Any] | None = None,
    ramp: bool = True, stop_at: float | None = None,
) -> list[PoolTrace]:
    """Replay ``pools`` in lockstep rounds (see the module's doc), each up to ``budget``
    evaluations, every pool's study seeded with ``seed``. ``share``: rebuild each pool's
    study with the other pools' results as its prior when they have grown as the operator
    rebuilds it (`controller.memory.refresh_due`: by a quarter). ``priors``:
    a fixed prior per pool (before the shared one). ``ramp``: batches ramp up by
    `slow_start` as the operator's fixed-size Pods do. ``stop_at``: stop once every pool
    has reached this fraction of its optimum (no count at or below it changes after)."""
    from fleettune.controller.memory import refresh_due
    from fleettune.optimize import Study, split_settings
    from fleettune.optimize.batching import slow_start

    settings = split_settings(strategy, options)
    fixed = list(priors) if priors is not None else [Prior([], []) for _ in pools]

    def build(i: int, prior: Prior) -> Any:
        r = pools[i].replay
        return Study(r.space, strategy=strategy, seed=seed, candidates=r.rows, prior=prior.observations,
                     prior_first=prior.first, **settings)

    # The cold studies also keep each pool's candidate set alive, so that the rebuilt ones share it.
    studies = [build(i, fixed[i]) for i in range(len(pools))]
    traces = [PoolTrace(budget=min(budget, len(p.replay.rows)), cost_of=p.gpu_s) for p in pools]
    builder = PriorBuilder(pools)
    built_from = [0] * len(pools)  # the other pools' results each study's prior holds
    reached = [False] * len(pools)
    rnd = 0
    while True:
        batches: list[list[dict[str, Any]]] = []
        for i, pool in enumerate(pools):
            tr = traces[i]
            left = tr.budget - len(tr.cand)
            if left <= 0:
                batches.append([])
                continue
            others = sum(len(t.cand) for j, t in enumerate(traces) if j != i)
            if share and rnd > 0 and refresh_due(built_from[i], others):
                shared = builder.shared(i, traces, rnd)
                prior = Prior(fixed[i].observations + shared.observations, shared.first or fixed[i].first)
                studies[i] = build(i, prior)
                built_from[i] = others
                for (config, outcome, value), c in zip(tr.observations, tr.cand, strict=True):
                    studies[i].observe(config, outcome, value, pool.replay.times[c] if value is not None else ())
            study = studies[i]
            k = slow_start(batch, len(tr.cand), 0) if ramp and study.learns else batch
            batches.append(study.suggest(min(k, left)))
        if not any(batches):
            break
        for i, configs in enumerate(batches):
            for config in configs:
                observe(pools[i], studies[i], config, traces[i])
                traces[i].rounds.append(rnd)
            if stop_at is not None and traces[i].cand:
                reached[i] = reached[i] or traces[i].evals_to(pools[i].replay.optimum, stop_at) <= len(traces[i].cand)
        rnd += 1
        if stop_at is not None and all(reached):
            break
    return traces


def sequential(
    pools: Sequence[Pool], order: Sequence[int], strategy: str, seed: int, budget: int, batch: int = 1, *,
    options: dict[str, Any] | None = None, ramp: bool = True, first: PoolTrace | None = None,
    stop_at: float | None = None,
) -> dict[int, PoolTrace]:
    """Tune ``pools`` one after another in ``order``, each warm-started from every earlier
    pool's full results (`PriorBuilder` groups, in tuning order), by pool index. ``first``:
    the first pool's cold run where it is already known (the independent mode's: the same
    study). ``stop_at``: the last pool stops there (no pool's results follow it)."""
    builder = PriorBuilder(pools)
    out: dict[int, PoolTrace] = {}
    for pos, i in enumerate(order):
        if pos == 0 and first is not None:
            out[i] = first
            continue
        prior = builder.groups(i, [out[j].observations for j in order[:pos]])
        last = pos == len(order) - 1
        (out[i],) = lockstep([pools[i]], strategy, seed, budget, batch, priors=[prior], options=options,
                             ramp=ramp, stop_at=stop_at if last else None)
    return out


def pool_figures(pool: Pool, trace: PoolTrace) -> dict[str, Any]:
    """Evaluations, GPU-seconds and rounds to each of `LEVELS` (budget + 1 evaluations,
    and every evaluation's seconds and rounds, where never: ``censored_<level>``)."""
    out: dict[str, Any] = {}
    for level in LEVELS:
        n = trace.evals_to(pool.replay.optimum, level)
        hit = n <= trace.budget
        out[f"evals_{level}"] = n
        out[f"censored_{level}"] = not hit
        out[f"gpu_seconds_{level}"] = trace.seconds(n if hit else None)
        out[f"rounds_{level}"] = (trace.rounds[n - 1] + 1) if hit else (max(trace.rounds, default=-1) + 1)
    return out


def fleet_parallel(pools: Sequence[Pool], traces: Sequence[PoolTrace], level: float = LEVELS[0]) -> dict[str, Any]:
    """The fleet's figures of a lockstep replay at ``level``: ``rounds``, the round in
    which the last pool reached it (wall-clock, in rounds), and ``gpu_seconds``, the
    GPU-seconds every pool spent in rounds up to that one (pools run on; none knows it is
    there). Censored (every round run) where a pool never reached it."""
    figs = [pool_figures(p, t) for p, t in zip(pools, traces, strict=True)]
    censored = any(f[f"censored_{level}"] for f in figs)
    last = max(max(t.rounds, default=-1) for t in traces) if censored else max(f[f"rounds_{level}"] for f in figs) - 1
    secs = [t.seconds_in_rounds(last) for t in traces]
    evals = sum(sum(1 for r in t.rounds if r <= last) for t in traces)
    return {"rounds": last + 1, "gpu_seconds": None if None in secs else float(sum(s or 0.0 for s in secs)),
            "evaluations": evals, "censored": censored}


def fleet_sequential(pools: Sequence[Pool], traces: dict[int, PoolTrace], order: Sequence[int],
                     level: float = LEVELS[0]) -> dict[str, Any]:
    """The fleet's figures of a sequential replay at ``level``: every pool before the last
    ran its full budget (its results feed the later ones), the last until it reached
    ``level``; ``rounds`` and ``gpu_seconds`` add them up. Censored where a pool never
    reached ``level``."""
    rounds = evals = 0
    secs: float | None = 0.0
    censored = False
    for pos, i in enumerate(order):
        t, f = traces[i], pool_figures(pools[i], traces[i])
        censored = censored or f[f"censored_{level}"]
        last = pos == len(order) - 1
        n = f[f"evals_{level}"] if last and not f[f"censored_{level}"] else len(t.cand)
        rounds += f[f"rounds_{level}"] if last else max(t.rounds, default=-1) + 1
        evals += n
        s = t.seconds(n)
        secs = None if secs is None or s is None else secs + s
    return {"rounds": rounds, "gpu_seconds": secs, "evaluations": evals, "censored": censored}
