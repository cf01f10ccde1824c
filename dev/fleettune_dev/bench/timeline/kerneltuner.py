"""The Kernel Tuner driver of `fleettune bench timeline`: the ``kernel_tuner:<strategy>``
modes, Kernel Tuner itself in its simulation mode on the recorded cache, put on the same
clock as the simulated fleet (one GPU, one configuration at a time).
"""

from __future__ import annotations

import math

import numpy as np

from fleettune_dev.bench.kerneltuner import KernelTunerCache
from fleettune_dev.bench.timeline.model import KT_PREFIX, Run, TimedSpace


def run_kernel_tuner(
    ts: TimedSpace,
    strategy: str,
    seed: int,
    budget: int,
    kt_cache: KernelTunerCache,
    *,
    stop_at: float | None = None,
) -> Run:
    """Kernel Tuner's own strategy in its simulation mode on the recording.

    Wall-clock: the recorded compile + verification + benchmark + framework time of each
    configuration the first time Kernel Tuner evaluates it (a repeat is served from its
    cache for free), plus the strategy time Kernel Tuner measured between evaluations (as
    our suggestion latency counts for us); one GPU, nothing overlapped. Kernel Tuner's
    ``seed`` seeds its strategy (see `KernelTunerCache.tune`).
    """
    results = kt_cache.tune(strategy, seed, budget)
    replay = ts.replay
    target = None if stop_at is None else replay.optimum / stop_at
    seen: set[int] = set()
    clock = 0.0
    latency = 0.0
    times: list[float] = []
    values: list[float] = []
    order: list[int] = []
    work = evaluated = 0.0
    best = math.inf
    for r in results:
        took = float(r.get("strategy_time") or 0.0) / 1000.0
        clock += took
        latency += took
        c = ts.index_of[tuple(r[k] for k in ts.keys)]
        if c in seen:
            continue
        seen.add(c)
        clock += float(ts.compile_s[c] + ts.verify_s[c] + ts.bench_s[c] + ts.framework_s[c])
        g = float(ts.verify_s[c] + ts.bench_s[c])
        evaluated += g
        if replay.failure[c] != "compile":
            work += g
        v = float(replay.time_ms[c])
        times.append(clock)
        values.append(v)
        order.append(c)
        best = min(best, v) if math.isfinite(v) else best
        if target is not None and best <= target * (1 + 1e-12):
            break
    return Run(ts.name, KT_PREFIX + strategy, 1, seed, np.asarray(times), np.asarray(values),
               np.asarray(order, dtype=np.int64), [(0.0, clock)],
               clock, gpu_work=work, allocated=clock, evaluated_gpu_s=evaluated, latency=latency)
