"""One seed of one source → target pair of `fleettune bench warmstart`: the replays and their row.

`drive` replays a study's sequential suggestions against a recording (the protocol of
`fleettune_dev.bench.strategy.run_once`), keeping the observations for a warm start;
`run_seed` runs the source study, then the target's warm (the source's observations as
``prior=``) and cold studies with the same seed, and returns the seed's row: the
evaluations each needs to reach every level of `LEVELS` (budget + 1: never), its fraction
of the optimum at each of `CHECKPOINTS`, and what the source's measurements are worth on
the target (``source_best_on_target``, ``source_reach``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleettune_dev.bench.replay import FAILURE_OUTCOME, Replay
from fleettune_job.protocol import Outcome

LEVELS = (0.95, 0.99)
CHECKPOINTS = (5, 10, 20, 50, 100)  # fraction of optimum after N target evaluations

Observation = tuple[dict[str, Any], Outcome, float | None]


@dataclass
class Drive:
    best: np.ndarray  # (budget,) best valid time after each evaluation (inf before any)
    observations: list[Observation]


def drive(replay: Replay, study: Any, budget: int, stop_at: float | None = None) -> Drive:
    """Replay ``budget`` sequential suggestions of ``study`` against the recording (the
    protocol of ``bench.strategy.run_once``, keeping the observations for a warm start).

    ``stop_at``: stop once optimum / best reaches this fraction (the rest of the trace
    keeps that best), since nothing after it changes an evals-to-level count."""
    lookup = study.candidates.lookup
    budget = min(budget, len(replay.rows))
    best = np.full(budget, np.inf)
    current = math.inf
    observations: list[Observation] = []
    for i in range(budget):
        configs = study.suggest(1)
        if not configs:
            best[i:] = current
            break
        c = int(lookup(np.asarray(replay.space.to_rows(configs), dtype=np.int32))[0])
        t = replay.time_ms[c]
        if math.isfinite(t):
            obs: Observation = (configs[0], Outcome.OK, float(t))
            study.observe(configs[0], Outcome.OK, float(t), replay.times[c])
            current = min(current, float(t))
        else:
            obs = (configs[0], FAILURE_OUTCOME.get(replay.failure[c] or "runtime", Outcome.RUNTIME_ERROR), None)
            study.observe(obs[0], obs[1])
        observations.append(obs)
        best[i] = current
        if stop_at is not None and replay.optimum / current >= stop_at - 1e-12:
            best[i:] = current
            break
    return Drive(best=best, observations=observations)


def evals_to(best: np.ndarray, optimum: float, level: float) -> int:
    """1-based evaluation at which optimum / best first reaches ``level``; len + 1 if never."""
    frac = np.where(np.isfinite(best), optimum / best, 0.0)
    hit = frac >= level - 1e-12
    return int(np.argmax(hit)) + 1 if hit.any() else len(best) + 1


def study_for(replay: Replay, strategy: str, seed: int, prior: list[Observation] | None,
              options: dict[str, Any] | None) -> Any:
    from fleettune.optimize import Study, split_settings

    return Study(replay.space, strategy=strategy, seed=seed, candidates=replay.rows, prior=prior or (),
                 **split_settings(strategy, options))


def run_seed(
    source: Replay, target: Replay, strategy: str, seed: int, source_budget: int, budget: int,
    options: dict[str, Any] | None = None, memo: dict[tuple[Any, ...], Drive] | None = None, *,
    source_options: dict[str, Any] | None = None, cold_row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One seed of one pair. ``memo``: runs that do not depend on the pair (a source's own
    run, a target's cold run), by recording name, seed and options, shared by the pairs of
    one invocation (the budgets and strategy must be the same across its calls).

    ``source_options``: the source run's options, where they differ from the target's (a
    ``--variant`` judges a setting for the re-tune; the source's results are an earlier
    round's, tuned as the baseline tunes). ``cold_row``: a row of this pair and seed whose
    cold figures hold for ``options`` too (they differ from its options only in warm-only
    ones, `Option.warm_only`): copied instead of running the cold study again."""
    memo = {} if memo is None else memo
    src_options = options if source_options is None else source_options
    skey = ("source", source.name, seed, _options_key(src_options))
    if skey not in memo:
        memo[skey] = drive(source, study_for(source, strategy, seed, None, src_options), source_budget)
    src = memo[skey]
    # The target study gets its own seed stream, so warm and cold differ only by the prior.
    tseed = seed + 100_003
    last = max(LEVELS)
    warm = drive(target, study_for(target, strategy, tseed, src.observations, options), budget, last)
    runs = [("warm", warm)]
    if cold_row is None:
        ckey = ("cold", target.name, seed, _options_key(options))
        if ckey not in memo:
            memo[ckey] = drive(target, study_for(target, strategy, tseed, None, options), budget, last)
        runs.append(("cold", memo[ckey]))
    # How good the source's own best is on the target: the value of copying it blindly.
    ok = [o for o in src.observations if o[1] == Outcome.OK]
    copied = math.nan
    if ok:
        copied = on_target(target, min(ok, key=lambda o: o[2] or math.inf)[0])
    # The best the source measured at all, on the target: what its data could point to.
    reach = max((on_target(target, o[0]) for o in src.observations), default=0.0)
    out: dict[str, Any] = {"seed": seed, "source_best_on_target": copied, "source_reach": reach}
    for name, run in runs:
        for level in LEVELS:
            out[f"{name}_{level}"] = evals_to(run.best, target.optimum, level)
        # A run stopped at 0.99 keeps that best: fractions after it are a lower bound.
        for n in CHECKPOINTS:
            if n <= len(run.best):
                b = run.best[n - 1]
                out[f"{name}_at_{n}"] = round(float(target.optimum / b) if math.isfinite(b) else 0.0, 4)
    if cold_row is not None:
        out.update({k: v for k, v in cold_row.items() if k.startswith("cold_")})
    return out


def _options_key(options: dict[str, Any] | None) -> str:
    return json.dumps(options or {}, sort_keys=True)


def target_lookup(replay: Replay, config: dict[str, Any]) -> int:
    row = np.asarray(replay.space.to_rows([config]), dtype=np.int32)
    match = np.flatnonzero((replay.rows == row).all(axis=1))
    return int(match[0]) if len(match) else -1


def on_target(target: Replay, config: dict[str, Any]) -> float:
    """Fraction of the target's optimum that ``config`` reaches there (0: fails or not recorded)."""
    t = target.time_ms[c] if (c := target_lookup(target, config)) >= 0 else math.nan
    return target.optimum / float(t) if math.isfinite(t) else 0.0
