"""Other tools' search strategies on the same replays (`fleettune bench strategy --peer`),
so that the optimiser is judged against the tuners users would otherwise reach for.

A peer sees a recording exactly as a `Study` does: it proposes a configuration, and only a
configuration of the space that was not measured before counts as an evaluation (its
recorded time, or its failure). A peer that proposes a configuration outside the space (one
the space's constraints exclude) or one it already measured is told so, at no cost to its
budget, as its own harness would; after ``MAX_PROPOSALS`` such proposals in a row, the
evaluation is a uniformly random new configuration, so that a peer stuck on what it has
measured still spends its budget.

``optuna-tpe``: Optuna's TPE sampler with its defaults (10 random startup trials, one
Parzen estimator per parameter), each parameter an integer over the indices of its values,
so that ordered values stay ordered. A failure, or a configuration outside the space, is
worse than any time: TPE splits its good and bad trials by rank, so no scale is invented.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fleettune_dev.bench.replay import Replay
from fleettune_dev.bench.strategy import RunTrace

MAX_PROPOSALS = 100
FAILED = 1e30  # worse than any recorded time, in ms


def run_tpe(replay: Replay, seed: int, budget: int) -> RunTrace:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    rows = replay.rows
    index = {tuple(int(v) for v in row): i for i, row in enumerate(rows)}
    ranges = [(f"p{j}", int(lo), int(hi)) for j, (lo, hi) in enumerate(zip(rows.min(axis=0), rows.max(axis=0),
                                                                          strict=True))]
    rng = np.random.default_rng(seed)
    budget = min(budget, len(rows))
    measured: dict[int, float] = {}
    best = np.full(budget, np.inf)
    current, invalid, skipped = math.inf, 0, 0
    while len(measured) < budget:
        trial = study.ask()
        row = tuple(trial.suggest_int(name, lo, hi) for name, lo, hi in ranges)
        c = index.get(row)
        own = c is not None and c not in measured
        if not own:
            study.tell(trial, FAILED if c is None else measured[c])
            skipped += 1
            if skipped < MAX_PROPOSALS:
                continue
            c = int(rng.choice(np.setdiff1d(np.arange(len(rows)), list(measured))))
        skipped = 0
        t = float(replay.time_ms[c])
        measured[c] = t if math.isfinite(t) else FAILED
        if own:
            study.tell(trial, measured[c])
        if math.isfinite(t):
            current = min(current, t)
        else:
            invalid += 1
        best[len(measured) - 1] = current
    return RunTrace(best=best, invalid=invalid, suggest_ms=[])


PEERS: dict[str, Callable[[Replay, int, int], RunTrace]] = {"optuna-tpe": run_tpe}
