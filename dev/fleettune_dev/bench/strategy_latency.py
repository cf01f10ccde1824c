"""`fleettune bench strategy --latency`: how long the Bayesian strategy takes to suggest.

`latency_report` times ``suggest(1)`` (wall and CPU milliseconds) after 220 observations,
on the first ``--cache`` recording when one is given and on a synthetic space of 10^6
configurations, against the naive baseline it replaces: BoTorch's generic posterior and
LogEI on every candidate. It only measures: it changes no study's choices.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fleettune_dev.bench.replay import Replay
from fleettune_job.protocol import Outcome

Answer = Callable[[dict], tuple[Outcome, float | None]]


def _time_suggestions(study: Any, answer: Answer, k: int, cpu: list[float] | None = None) -> list[float]:
    """Wall milliseconds per suggest(1), observing each answer as a live study would;
    CPU milliseconds go to ``cpu`` (on a shared machine, wall time measures the neighbours)."""
    out = []
    for _ in range(k):
        t0, c0 = time.perf_counter(), time.process_time()
        (config,) = study.suggest(1)
        out.append(1000.0 * (time.perf_counter() - t0))
        if cpu is not None:
            cpu.append(1000.0 * (time.process_time() - c0))
        study.observe(config, *answer(config))
    return out


def _naive_botorch_ms(study: Any, n_score: int) -> float:
    """The baseline being engineered away: BoTorch's generic posterior + LogEI on every
    candidate (hyperparameter fitting not counted)."""
    import torch
    from botorch.acquisition.analytic import LogExpectedImprovement
    from botorch.models import SingleTaskGP

    h = study.history
    ok = np.isfinite(h.value)
    y = np.log(h.value[ok])
    y = (y - y.mean()) / y.std()
    model = SingleTaskGP(torch.as_tensor(h.x[ok]), torch.as_tensor(y).unsqueeze(-1), outcome_transform=None)
    model.eval()
    acq = LogExpectedImprovement(model, best_f=float(y.min()), maximize=False)
    xc = torch.as_tensor(study.candidates.x[:n_score])
    t0 = time.perf_counter()
    with torch.no_grad():
        for s in range(0, len(xc), 4096):
            acq(xc[s : s + 4096].unsqueeze(1))
    return 1000.0 * (time.perf_counter() - t0)


def _synthetic_space(n_params: int = 6, n_values: int = 10) -> tuple[Any, Answer]:
    """10^6 configurations: a smooth landscape with a failing corner (for latency only)."""
    from fleettune.space import SearchSpace

    params = [{"name": f"p{i}", "type": "integer", "range": {"min": 1, "max": n_values}} for i in range(n_params)]
    space = SearchSpace.from_spec(params, [])

    def answer(c: dict) -> tuple[Outcome, float | None]:
        v = [c[f"p{i}"] / n_values for i in range(n_params)]
        if v[0] * v[1] > 0.6:
            return Outcome.COMPILE_ERROR, None
        return Outcome.OK, 1.0 + sum((x - 0.3 - 0.07 * i) ** 2 for i, x in enumerate(v))

    return space, answer


def latency_report(args: argparse.Namespace, loader: Callable[[str], Replay], options: dict[str, Any]) -> str:
    from fleettune.optimize import Study, split_settings

    lines = [f"torch threads: {args.threads}"]
    rng = np.random.default_rng(0)
    k = 15
    if args.cache:
        replay = loader(args.cache[0])
        study = Study(replay.space, "bayes", seed=0, candidates=replay.rows, **split_settings("bayes", options))

        def answer(config: dict) -> tuple[Outcome, float | None]:
            c = int(study.candidates.lookup(np.asarray(replay.space.to_rows([config]), dtype=np.int32))[0])
            t = replay.time_ms[c]
            return (Outcome.OK, float(t)) if math.isfinite(t) else (Outcome.RUNTIME_ERROR, None)

        for c in rng.choice(len(replay.rows), 220, replace=False):
            config = replay.space.to_configs(replay.rows[c : c + 1])[0]
            study.observe(config, *answer(config))
        cpu: list[float] = []
        ms = _time_suggestions(study, answer, k, cpu)
        naive = _naive_botorch_ms(study, len(replay.rows))
        lines.append(
            f"{replay.name}: {len(replay.rows)} candidates, 220 observations: suggest(1) median "
            f"{statistics.median(ms):.1f} ms wall, {statistics.median(cpu):.1f} ms CPU "
            f"(min {min(ms):.1f}, max {max(ms):.1f}, {k} calls; the first rebuilds the fits); "
            f"naive BoTorch LogEI over all candidates: {naive:.0f} ms"
        )
    space, answer = _synthetic_space()
    t0 = time.perf_counter()
    study = Study(space, "bayes", seed=0, **split_settings("bayes", options))
    init_s = time.perf_counter() - t0
    n_cand = len(study.candidates)
    for row in study.candidates.rows[rng.choice(n_cand, 220, replace=False)]:
        config = space.to_configs(row.reshape(1, -1))[0]
        study.observe(config, *answer(config))
    cpu2: list[float] = []
    ms = _time_suggestions(study, answer, k, cpu2)
    part = 50_000
    naive = _naive_botorch_ms(study, part) * n_cand / part
    lines.append(
        f"synthetic {n_cand} candidates, 220 observations: suggest(1) median {statistics.median(ms):.1f} ms "
        f"wall, {statistics.median(cpu2):.1f} ms CPU (min {min(ms):.1f}, max {max(ms):.1f}); "
        f"study set-up {init_s:.1f} s once; "
        f"naive BoTorch LogEI over all candidates: ~{naive / 1000:.1f} s (extrapolated from {part})"
    )
    return "\n".join(lines)
