"""The Kernel Tuner driver of `fleettune bench timeline`: the ``kernel_tuner:<strategy>``
modes, Kernel Tuner itself in its simulation mode on the recorded cache, put on the same
clock as the simulated fleet (one GPU, one configuration at a time).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_dev.bench.timeline.model import KT_PREFIX, Run, TimedSpace


class KernelTunerCache:
    """The decompressed copy of a cache that Kernel Tuner reads (it wants a ``.json``
    path) and the restriction that makes its search space the recorded one."""

    def __init__(self, ts: TimedSpace, directory: Path) -> None:
        if ts.path is None:
            raise ValueError("Kernel Tuner needs the cache file")
        raw = ts.path.read_bytes()
        text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
        self.data = json.loads(text)
        self.path = directory / (ts.name.split(".")[0] + ".json")
        self.path.write_text(text)
        keys = list(self.data.get("tune_params_keys") or self.data["tune_params"])
        if keys != ts.keys:
            raise ValueError(f"{ts.name}: parameter order differs from the parsed space")
        # Every recorded key, failures included: the files hold exactly the restricted
        # space, and a configuration that failed still costs Kernel Tuner its compile
        # (kernel_tuner.util.infer_restrictions_from_cache would drop failures and let
        # Kernel Tuner skip them for free).
        self.valid = {tuple(e[k] for k in keys) for e in self.data["cache"].values()}


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
    ``seed`` argument is unused in 1.5, its strategies draw from the global ``random`` and
    ``numpy.random`` generators: both are seeded.
    """
    from constraint import FunctionConstraint
    from kernel_tuner import tune_kernel

    data = kt_cache.data
    valid = kt_cache.valid

    def recorded(*values: Any) -> bool:
        return values in valid

    size = data["problem_size"]
    problem_size = tuple(size) if isinstance(size, list) else (size,)
    random.seed(seed)
    np.random.seed(seed)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        results, _ = tune_kernel(
            data["kernel_name"], "/* replayed from the cache */", problem_size, [],
            {k: data["tune_params"][k] for k in ts.keys},
            restrictions=[FunctionConstraint(recorded)], cache=str(kt_cache.path), simulation_mode=True,
            strategy=strategy, strategy_options={"max_fevals": budget}, quiet=True,
        )
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
