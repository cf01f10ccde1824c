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

``kernel-tuner-genetic-algorithm``, ``kernel-tuner-bayes-opt``: Kernel Tuner's own strategies
with their defaults, run by Kernel Tuner itself in its simulation mode on the recording (the
space restricted to the replay's configurations), scored on the configurations it evaluates,
in its order. A strategy that ends before the budget (Kernel Tuner stops one that has
converged) spends the rest on uniformly random new configurations, as a stuck TPE does.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from fleettune_dev.bench.kerneltuner import KernelTunerCache
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


_KT_CACHES: dict[Path, KernelTunerCache] = {}
_KT_DIR: list[tempfile.TemporaryDirectory[str]] = []


def run_kernel_tuner(strategy: str, replay: Replay, seed: int, budget: int) -> RunTrace:
    if replay.path is None:
        raise ValueError(f"{replay.name}: Kernel Tuner replays the recording's file, and this replay has none")
    names = list(replay.space.names)
    if replay.path not in _KT_CACHES:
        if not _KT_DIR:
            _KT_DIR.append(tempfile.TemporaryDirectory(prefix="fleettune-kt-"))
        _KT_CACHES[replay.path] = KernelTunerCache(replay.path, names, Path(_KT_DIR[0].name))
    values = [p.values for p in replay.space.parameters]
    index = {tuple(values[j][int(v)] for j, v in enumerate(row)): i for i, row in enumerate(replay.rows)}
    budget = min(budget, len(replay.rows))
    order: list[int] = []
    for r in _KT_CACHES[replay.path].tune(strategy, seed, budget, space=index):
        c = index[tuple(r[k] for k in names)]
        if c not in order:
            order.append(c)
    order = order[:budget]
    if len(order) < budget:
        rest = np.setdiff1d(np.arange(len(replay.rows)), order)
        order += np.random.default_rng(seed).choice(rest, budget - len(order), replace=False).tolist()
    t = replay.time_ms[order]
    best = np.minimum.accumulate(np.where(np.isfinite(t), t, np.inf))
    return RunTrace(best=best, invalid=int(np.sum(~np.isfinite(t))), suggest_ms=[])


PEERS: dict[str, Callable[[Replay, int, int], RunTrace]] = {
    "optuna-tpe": run_tpe,
    "kernel-tuner-genetic-algorithm": partial(run_kernel_tuner, "genetic_algorithm"),
    "kernel-tuner-bayes-opt": partial(run_kernel_tuner, "bayes_opt"),
}
