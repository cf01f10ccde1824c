"""`fleettune bench timeline`: wall-clock and GPU-seconds until a kernel is tuned.

A discrete-event replay of recorded Kernel Tuner caches, no cluster: the real `Study`
suggests (its latency measured with ``perf_counter`` and put on the simulated clock),
each configuration costs what the recording says it cost (compile, verification,
benchmark), on a pool of ``--gpus`` GPUs whose Pods start in a time drawn from a
log-normal model. Modes:

* ``pod``: one configuration per Pod (start-up + compile + verification + benchmark,
  the GPU held for the Pod's whole life), one Pod per GPU at a time, the study
  suggesting with the in-flight configurations pending;
* ``batch``: batched Pods with compile-ahead (issue #16): one start-up per Pod, compiles
  on the node's CPU cores ahead of the GPU, the batch size from
  `fleettune.optimize.batching.batch_size`;
* ``kernel_tuner:<strategy>``: Kernel Tuner itself in its simulation mode on the same
  cache; its wall-clock is the recorded cost of what it evaluated, in its order, one
  configuration at a time on one GPU.

Per space, seed and mode: wall-clock and GPU-seconds to 0.95 and 0.99 of the recorded
optimum, GPU-busy fraction and evaluations. docs/bench-timeline.md has the model and
the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import heapq
import io
import json
import math
import os
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleettune.api.spec import KernelSpec
from fleettune.jobs import prune_above_ms
from fleettune_dev.bench.strategy import FAILURE_OUTCOME, Replay
from fleettune_dev.sim.answer import pruned_result, scaled_runs
from fleettune_dev.sim.startup import PodStartup
from fleettune_job.ahead import MAX_COMPILE_WORKERS
from fleettune_job.protocol import PRUNE_RUNS, Outcome
from fleettune_job.timing import pruned_after

LEVELS = (0.95, 0.99)
KT_PREFIX = "kernel_tuner:"
DEFAULT_MODES = ("pod", "batch", "kernel_tuner:genetic_algorithm", "kernel_tuner:bayes_opt",
                 "kernel_tuner:random_sample")
FLEET_MODES = ("pod", "batch")
PRUNE_SLOWER_THAN: float = KernelSpec.model_fields["prune_slower_than"].default  # the operator's default
# The recorded spaces live next to the repository (../shared/data/spaces, data/README.md).
DEFAULT_SPACES = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "spaces"
Z99 = 2.3263478740408408  # standard normal quantile of 0.99
# Targets of issue #17 (docs/bench-timeline.md).
GPU_S_PER_EVAL_FACTOR = 1.25
WALL_RATIO_TARGET = {1: 1 / 2, 4: 1 / 6}


# -- the model ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetModel:
    """What the fleet modes assume besides the recording (docs/bench-timeline.md)."""

    startup: PodStartup = field(default_factory=PodStartup)
    # Compile processes of a batched Pod: what the job image runs on a node with cores to
    # spare (one per core but one, at most MAX_COMPILE_WORKERS).
    cpus: int = MAX_COMPILE_WORKERS
    pod_seconds: float = 60.0  # GPU time a batched Pod aims at
    max_batch: int = 16
    # Kernel Tuner's per-configuration overhead (argument set-up, cache writes) is not in
    # the model of a Pod; this adds it to every configuration's GPU time to see
    # how much the comparison leans on leaving it out.
    framework_on_gpu: bool = False
    # The operator reads the answers a running batched Pod prints (the job image's
    # ``fleettune-answer`` log lines) and steps at every Pod end and at least every this many
    # seconds (0: at each answer, as the operator does: it follows the Pods' logs). None:
    # it learns a Pod's answers when the Pod ends (its termination message; the operator
    # with ``FLEETTUNE_FOLLOW_ANSWERS=0``, or before it followed logs).
    stream_poll_s: float | None = 0.0
    # The operator's pruning (`kernel.pruneSlowerThan`): a configuration whose first
    # PRUNE_RUNS recorded runs have a median over this factor times the best time known when
    # its Pod was created is timed no further and not verified (those runs' share of its
    # recorded benchmark time is spent), and the study observes its time from those runs
    # (`observe_recorded`). 0: off.
    prune_slower_than: float = PRUNE_SLOWER_THAN

    def __post_init__(self) -> None:
        if self.cpus < 1:
            raise ValueError(f"cpus must be at least 1, got {self.cpus}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {self.max_batch}")
        if not self.pod_seconds > 0:
            raise ValueError(f"pod_seconds must be positive, got {self.pod_seconds}")
        if self.prune_slower_than != 0 and not self.prune_slower_than >= 1:
            raise ValueError(f"prune_slower_than must be 0 (off) or >= 1, got {self.prune_slower_than}")
        if self.stream_poll_s is not None and not self.stream_poll_s >= 0:
            raise ValueError(f"stream_poll_s must be >= 0, got {self.stream_poll_s}")


@dataclass
class TimedSpace:
    """A recorded space with what each configuration cost when it was recorded (seconds)."""

    replay: Replay
    compile_s: np.ndarray
    verify_s: np.ndarray
    bench_s: np.ndarray
    framework_s: np.ndarray
    path: Path | None = None
    # Kernel Tuner's view of the same file: parameter order, and candidate number by the
    # tuple of parameter values (to place what Kernel Tuner evaluated).
    keys: list[str] = field(default_factory=list)
    index_of: dict[tuple[Any, ...], int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.replay.name

    @property
    def compile_failed(self) -> np.ndarray:
        return np.array([f == "compile" for f in self.replay.failure])

    def gpu_s(self, framework_on_gpu: bool = False) -> np.ndarray:
        """GPU critical-path seconds of each configuration (0 where the build failed)."""
        g = self.verify_s + self.bench_s + (self.framework_s if framework_on_gpu else 0.0)
        return np.where(self.compile_failed, 0.0, g)


def _seconds(records: Sequence[Any], name: str) -> np.ndarray:
    out = np.zeros(len(records))
    for i, r in enumerate(records):
        v = r.extras.get(name)
        if isinstance(v, int | float) and math.isfinite(v) and v > 0:
            out[i] = float(v) / 1000.0  # Kernel Tuner records milliseconds
    return out


def load_timed_space(path: str | Path) -> TimedSpace:
    """A Kernel Tuner cache with its recorded costs; ValueError when it records none."""
    from fleettune_dev.interop import read_kernel_tuner_cache

    rec = read_kernel_tuner_cache(path)
    replay = Replay(
        name=Path(path).name,
        space=rec.space,
        rows=np.asarray(rec.rows, dtype=np.int32),
        time_ms=np.array([np.nan if r.time_ms is None else float(r.time_ms) for r in rec.records]),
        failure=[r.failure for r in rec.records],
        times=[list(r.times or []) for r in rec.records],
    )
    costs = {k: _seconds(rec.records, k) for k in ("compile_time", "verification_time", "benchmark_time",
                                                    "framework_time")}
    if not any(c.any() for c in costs.values()):
        raise ValueError(f"{path}: records no compile/verification/benchmark times; nothing to put on a clock")
    keys = [p.name for p in rec.space.parameters]
    index_of = {tuple(r.config[k] for k in keys): i for i, r in enumerate(rec.records)}
    return TimedSpace(replay, costs["compile_time"], costs["verification_time"], costs["benchmark_time"],
                      costs["framework_time"], Path(path), keys, index_of)


# -- one Pod ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodRun:
    """What happened in one Pod, in simulated seconds."""

    start: float  # GPU allocated (the Pod is bound to it)
    ready: float  # start-up done: compiles and GPU work may begin
    end: float  # GPU released
    configs: np.ndarray  # candidate numbers, in evaluation order
    gpu_work: float  # seconds the GPU verified and benchmarked
    gpu_s: np.ndarray  # of each configuration
    pruned: np.ndarray | None = None  # which configurations were timed for PRUNE_RUNS runs only

    @property
    def lifetime(self) -> float:
        return self.end - self.start


def plan_pod(start: float, startup_s: float, compile_s: Sequence[float], gpu_s: Sequence[float],
             compile_failed: Sequence[bool], cpus: int) -> tuple[float, float]:
    """(end, gpu_work) of a Pod that starts at ``start`` and evaluates its configurations
    in order (see `pod_answers`)."""
    answered, work = pod_answers(start, startup_s, compile_s, gpu_s, compile_failed, cpus)
    return (float(answered[-1]) if len(answered) else start + startup_s), work


def pod_answers(start: float, startup_s: float, compile_s: Sequence[float], gpu_s: Sequence[float],
                compile_failed: Sequence[bool], cpus: int) -> tuple[np.ndarray, float]:
    """(when each configuration's answer is printed, gpu_work) of a Pod that starts at
    ``start`` and evaluates its configurations in order.

    Compiles go to ``cpus`` workers in order (a process pool: each starts when a worker
    frees); the GPU verifies and benchmarks the configurations in order, each once its
    compile is done; a configuration whose compile failed never reaches the GPU. Answers
    come out in order (the batch supervisor's), so one waits for those before it; the Pod
    ends with its last answer. One configuration with one core is a plain
    one-configuration Pod: start-up + compile + GPU time.
    """
    ready = start + startup_s
    workers = [ready] * max(1, min(cpus, len(compile_s)))
    gpu_free = ready
    last = ready
    work = 0.0
    answered = np.zeros(len(compile_s))
    for i, (c, g, failed) in enumerate(zip(compile_s, gpu_s, compile_failed, strict=True)):
        begin = heapq.heappop(workers)
        built = begin + float(c)
        heapq.heappush(workers, built)
        if not failed:
            gpu_free = max(gpu_free, built) + float(g)
            work += float(g)
            built = gpu_free
        last = max(last, built)
        answered[i] = last
    return answered, work


# -- one run ------------------------------------------------------------------------------


@dataclass
class Run:
    """One (space, mode, GPUs, seed) run on the simulated clock."""

    space: str
    mode: str
    gpus: int
    seed: int
    times: np.ndarray  # (n,) when each evaluation's result was known, observation order
    values: np.ndarray  # (n,) its time in ms, nan where it failed
    order: np.ndarray  # (n,) its candidate number (index into the recording)
    spans: list[tuple[float, float]]  # GPU allocations (start, end), in-flight ones included
    end: float  # when the run stopped (budget spent, or --stop-at reached)
    gpu_work: float = 0.0  # verification + benchmark seconds, finished work
    allocated: float = 0.0  # GPU seconds of finished Pods (Kernel Tuner: the run)
    startup: float = 0.0  # start-up seconds of finished Pods
    evaluated_gpu_s: float = 0.0  # recorded verification + benchmark of finished evaluations
    pods: int = 0  # finished Pods
    latency: float = 0.0  # seconds of suggestion/strategy time put on the clock
    batches: list[int] = field(default_factory=list)  # size of every finished Pod

    def gpu_seconds(self, until: float) -> float:
        return float(sum(max(0.0, min(e, until) - s) for s, e in self.spans if s < until))


def observe_recorded(study: Any, replay: Replay, config: dict[str, Any], c: int, pruned: bool = False) -> float:
    """Feed the study configuration ``c``'s recorded result, as the job reports it: a pruned
    one from its first `PRUNE_RUNS` runs on the recording's scale (`pruned_result`).
    Returns the time (NaN: failed)."""
    t = replay.time_ms[c]
    if math.isfinite(t):
        t, runs = pruned_result(float(t), replay.times[c]) if pruned else (float(t), replay.times[c])
        study.observe(config, Outcome.OK, t, runs)
        return t
    study.observe(config, FAILURE_OUTCOME.get(replay.failure[c] or "runtime", Outcome.RUNTIME_ERROR))
    return math.nan


def startup_draws(seed: int) -> np.random.Generator:
    """The normal draws behind a seed's Pod start-ups, one per Pod in launch order.
    Common random numbers: every mode and pool size of a seed draws the same start-ups."""
    return np.random.default_rng([seed, 0x57A27])


def clairvoyant_s(ts: TimedSpace, model: FleetModel, gpus: int, seed: int, level: float = 0.95) -> float:
    """Seconds until a tuner that knew the answer would know a configuration at ``level``
    of the optimum: the first of the pool's opening Pods to finish its start-up (the
    seed's own draws) compiles and measures the cheapest such configuration alone.

    No tuner does better under the model, so a wall-clock target below this bound's mean
    ratio cannot be met, and one just above it leaves a real tuner no room to search."""
    r = ts.replay
    good = np.nan_to_num(r.time_ms, nan=np.inf) <= r.optimum / level
    cheapest = float((ts.compile_s + ts.gpu_s(model.framework_on_gpu))[good].min())
    rng = startup_draws(seed)
    return min(model.startup.at(float(rng.standard_normal())) for _ in range(gpus)) + cheapest


def random_expectation_s(ts: TimedSpace, level: float = 0.95) -> float:
    """Kernel Tuner's ``random_sample`` on one GPU, its exact expected seconds until a
    configuration at ``level`` of the optimum is known: the mean over every order in
    which it could draw the recording's configurations (uniformly, without repeats), each
    costing its recorded compile + verification + benchmark + framework time.

    Each of the B configurations below ``level`` comes before all G at it with probability
    1 / (G + 1), and the first of those G is any one of them alike, so the expectation is
    sum(cost of the B) / (G + 1) + mean(cost of the G). Where good configurations are
    common, a few seeds' mean of such draws is mostly the luck of their first draws; this
    is the same baseline with no seed in it. The strategy's own time between draws
    (milliseconds) is left out."""
    r = ts.replay
    cost = ts.compile_s + ts.verify_s + ts.bench_s + ts.framework_s
    good = np.nan_to_num(r.time_ms, nan=np.inf) <= r.optimum / level
    return float(cost[~good].sum() / (good.sum() + 1) + cost[good].mean())


def pruned_runs(ts: TimedSpace, idx: np.ndarray, gpu_s: np.ndarray,
                cutoff_ms: float | None) -> tuple[np.ndarray, np.ndarray]:
    """GPU seconds of configurations ``idx``, and which of them are pruned: those whose
    first `PRUNE_RUNS` recorded runs, on the recording's scale (`scaled_runs`), have a median
    above ``cutoff_ms`` (`pruned_after`) stop benchmarking there and are not verified (None:
    nothing is pruned)."""
    out = gpu_s[idx].copy()
    pruned = np.zeros(len(idx), dtype=bool)
    if cutoff_ms is None:
        return out, pruned
    for j, c in enumerate(idx):
        runs, t = ts.replay.times[c], float(ts.replay.time_ms[c])
        if out[j] > 0 and math.isfinite(t) and pruned_after(scaled_runs(t, runs), len(runs), cutoff_ms):
            out[j] -= ts.verify_s[c] + ts.bench_s[c] * (1 - PRUNE_RUNS / len(runs))
            pruned[j] = True
    return out, pruned


_END, _READ = 0, 1  # event kinds of `simulate_fleet`: a Pod ends; the operator reads answers


def simulate_fleet(
    ts: TimedSpace,
    mode: str,
    gpus: int,
    seed: int,
    budget: int,
    model: FleetModel | None = None,
    *,
    strategy: str = "bayes",
    options: dict[str, Any] | None = None,
    stop_at: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Run:
    """Replay ``mode`` ("pod" or "batch") on ``gpus`` GPUs with the real `Study`.

    The operator is one thread: its suggest and observe calls take the time ``clock``
    measures, one after another, and a Pod starts when the suggestion it runs is made.
    Results of a Pod are observed in evaluation order when the Pod ends or, with
    ``model.stream_poll_s`` (batched Pods), as the operator reads them from running Pods.
    ``stop_at``: stop once optimum / best reaches it (nothing later changes a time to that
    level).
    """
    from fleettune.optimize import Study
    from fleettune.optimize.batching import batch_size

    if mode not in FLEET_MODES:
        raise ValueError(f"unknown fleet mode {mode!r}")
    model = model or FleetModel()
    replay = ts.replay
    study = Study(replay.space, strategy=strategy, seed=seed, candidates=replay.rows, options=options)
    lookup = study.candidates.lookup
    gpu_s = ts.gpu_s(model.framework_on_gpu)
    failed = ts.compile_failed
    rng = startup_draws(seed)
    budget = min(budget, len(replay.rows))
    run = Run(ts.name, mode, gpus, seed, np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64), [], 0.0)
    times: list[float] = []
    values: list[float] = []
    order: list[int] = []
    measured: list[float] = []
    # seq -> (the Pod, its configurations, its start-up, when each answer is printed,
    # how many of its answers the operator has read)
    inflight: dict[int, tuple[PodRun, list[dict[str, Any]], float, np.ndarray, int]] = {}
    events: list[tuple[float, int, int]] = []  # (time, END or READ, seq)
    free = gpus  # idle GPUs; which one does not matter
    op_free = 0.0  # when the operator's thread is next idle
    assigned = 0
    seq = 0
    now = 0.0
    best = math.inf
    target = None if stop_at is None else replay.optimum / stop_at
    exhausted = False
    poll = model.stream_poll_s if mode == "batch" else None
    reading = False  # a READ step is scheduled

    def launch(at: float) -> bool:
        nonlocal op_free, assigned, seq, exhausted, reading
        k = 1 if mode == "pod" else batch_size(measured, model.pod_seconds, model.max_batch, budget - assigned,
                                               pods=gpus, startup_s=model.startup.p50_s)
        pending = [c for _, configs, _, _, read in inflight.values() for c in configs[read:]]
        t0 = clock()
        configs = study.suggest(k, pending)
        took = clock() - t0
        run.latency += took
        op_free = max(at, op_free) + took
        if not configs:
            exhausted = True
            return False
        idx = lookup(np.asarray(replay.space.to_rows(configs), dtype=np.int32))
        startup = model.startup.at(float(rng.standard_normal()))
        cpus = 1 if mode == "pod" else model.cpus
        cutoff = prune_above_ms(model.prune_slower_than, best if math.isfinite(best) else None)
        g, cut = pruned_runs(ts, idx, gpu_s, cutoff)
        answered, work = pod_answers(op_free, startup, ts.compile_s[idx], g, failed[idx], cpus)
        pod = PodRun(op_free, op_free + startup, float(answered[-1]), idx, work, g, cut)
        inflight[seq] = (pod, configs, startup, answered, 0)
        run.spans.append((pod.start, pod.end))
        heapq.heappush(events, (pod.end, _END, seq))
        if poll == 0:
            for t in answered[:-1]:
                heapq.heappush(events, (float(t), _READ, seq))
        elif poll is not None and not reading:
            heapq.heappush(events, ((math.floor(op_free / poll) + 1) * poll, _READ, -1))
            reading = True
        seq += 1
        assigned += len(configs)
        return True

    def read(key: int, upto: float) -> None:
        """Observe the answers of Pod ``key`` printed by ``upto`` that were not read yet."""
        nonlocal best
        pod, configs, startup, answered, done = inflight[key]
        n = int(np.searchsorted(answered, upto, side="right"))
        for j in range(done, n):
            c = int(pod.configs[j])
            v = observe_recorded(study, replay, configs[j], c, pod.pruned is not None and bool(pod.pruned[j]))
            times.append(now)
            values.append(v)
            order.append(c)
            if not failed[c]:
                measured.append(float(pod.gpu_s[j]))
            if v < best:
                best = v
        inflight[key] = (pod, configs, startup, answered, max(done, n))

    while True:
        while free and assigned < budget and not exhausted:
            if not launch(now):
                break
            free -= 1
        if not events:
            break
        now, kind, key = heapq.heappop(events)
        t0 = clock()
        # A step reads every running Pod's answers when they stream; otherwise only the
        # ended Pod's termination message.
        for other in (list(inflight) if poll is not None else [key] if kind == _END else []):
            read(other, now)
        took = clock() - t0
        run.latency += took
        op_free = max(now, op_free) + took
        if kind == _READ and key < 0 and poll:
            reading = bool(inflight)
            if reading:
                heapq.heappush(events, (now + poll, _READ, -1))
        if kind == _END:
            pod, configs, startup, _, _ = inflight.pop(key)
            run.pods += 1
            run.allocated += pod.lifetime
            run.gpu_work += pod.gpu_work
            run.startup += startup
            run.evaluated_gpu_s += float((ts.verify_s[pod.configs] + ts.bench_s[pod.configs]).sum())
            run.batches.append(len(configs))
            free += 1
        if target is not None and best <= target * (1 + 1e-12):
            break
    run.times = np.asarray(times)
    run.values = np.asarray(values)
    run.order = np.asarray(order, dtype=np.int64)
    run.end = now
    return run


# -- Kernel Tuner -------------------------------------------------------------------------


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


# -- metrics ------------------------------------------------------------------------------


def reach(run: Run, optimum: float, level: float) -> dict[str, float] | None:
    """Wall-clock, GPU-seconds and evaluations until optimum / best >= ``level`` is known
    (None when the run never got there). Evaluations: all results known by then."""
    v = np.where(np.isfinite(run.values), run.values, np.inf)
    best = np.minimum.accumulate(v) if len(v) else v
    hit = np.flatnonzero(optimum / best >= level - 1e-12)
    if len(hit) == 0:
        return None
    t = float(run.times[hit[0]])
    return {"wall_s": t, "gpu_s": run.gpu_seconds(t), "evals": int(np.searchsorted(run.times, t, side="right"))}


def run_metrics(run: Run, optimum: float) -> dict[str, Any]:
    n = len(run.values)
    out: dict[str, Any] = {
        "space": run.space, "mode": run.mode, "gpus": run.gpus, "seed": run.seed,
        "evals": n, "wall_s": run.end, "gpu_s": run.gpu_seconds(run.end),
        "busy": run.gpu_work / run.allocated if run.allocated > 0 else 0.0,
        "pods": run.pods, "mean_batch": float(np.mean(run.batches)) if run.batches else 1.0,
        "gpu_s_per_eval": run.allocated / sum(run.batches) if run.batches else run.allocated / max(n, 1),
        # issue #17's bound: 1.25 x recorded verification + benchmark, plus the start-up
        # spread over the batch (per evaluation of finished Pods)
        "gpu_s_per_eval_bound": (
            (GPU_S_PER_EVAL_FACTOR * run.evaluated_gpu_s + run.startup) / sum(run.batches) if run.batches
            else GPU_S_PER_EVAL_FACTOR * run.evaluated_gpu_s / max(n, 1)),
        "latency_s": run.latency,
        "best_fraction": float(optimum / np.nanmin(run.values)) if np.isfinite(run.values).any() else 0.0,
    }
    for level in LEVELS:
        out[f"to_{level}"] = reach(run, optimum, level)
    return out


def curve(run: Run, optimum: float) -> tuple[np.ndarray, np.ndarray]:
    """(time, fraction of optimum) steps of a run."""
    v = np.where(np.isfinite(run.values), run.values, np.inf)
    best = np.minimum.accumulate(v) if len(v) else v
    return run.times, np.where(np.isfinite(best), optimum / best, 0.0)


# -- the benchmark ------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    path: str
    mode: str
    gpus: int
    seed: int
    budget: int
    model: FleetModel
    strategy: str
    options: dict[str, Any]
    stop_at: float | None

    def key(self) -> str:
        fleet = self.mode in FLEET_MODES
        return json.dumps([Path(self.path).name, self.mode, self.gpus, self.seed, self.budget,
                           asdict(self.model) if fleet else None, self.strategy if fleet else None,
                           self.options if fleet else None, self.stop_at], sort_keys=True)


_SPACES: dict[str, TimedSpace] = {}
_KT: dict[str, KernelTunerCache] = {}
_TMP: list[tempfile.TemporaryDirectory[str]] = []


def _space(path: str) -> TimedSpace:
    if path not in _SPACES:
        _SPACES[path] = load_timed_space(path)
    return _SPACES[path]


def execute(job: Job) -> tuple[str, Run, float]:
    """Run one job: (its key, the run, the real seconds it took)."""
    t0 = time.perf_counter()
    ts = _space(job.path)
    if job.mode in FLEET_MODES:
        run = simulate_fleet(ts, job.mode, job.gpus, job.seed, job.budget, job.model, strategy=job.strategy,
                             options=job.options, stop_at=job.stop_at)
    else:
        if job.path not in _KT:
            if not _TMP:
                _TMP.append(tempfile.TemporaryDirectory(prefix="fleettune-kt-"))
            _KT[job.path] = KernelTunerCache(ts, Path(_TMP[0].name))
        run = run_kernel_tuner(ts, job.mode[len(KT_PREFIX):], job.seed, job.budget, _KT[job.path],
                               stop_at=job.stop_at)
    return job.key(), run, time.perf_counter() - t0


def _worker_init(threads: int) -> None:
    import torch

    torch.set_num_threads(max(1, threads))
    # The optimiser's fitting warnings (gpytorch, scipy) would bury the progress lines;
    # they change no result.
    warnings.simplefilter("ignore")


def _run_to_json(key: str, run: Run) -> str:
    d = {k: v for k, v in asdict(run).items() if k not in ("times", "values", "order")}
    d["times"] = run.times.tolist()
    d["order"] = run.order.tolist()
    d["values"] = [None if not math.isfinite(v) else float(v) for v in run.values]
    return json.dumps({"key": key, "run": d})


def _run_from_json(line: str) -> tuple[str, Run]:
    rec = json.loads(line)
    d = rec["run"]
    d["times"] = np.asarray(d["times"], dtype=float)
    d["order"] = np.asarray(d["order"], dtype=np.int64)
    d["values"] = np.array([math.nan if v is None else v for v in d["values"]], dtype=float)
    d["spans"] = [tuple(s) for s in d["spans"]]
    return rec["key"], Run(**d)


def _load_trace_keys(traces: Path | None) -> list[str]:
    if traces is None or not traces.exists():
        return []
    return [json.loads(line)["key"] for line in traces.read_text().splitlines() if line.strip()]


def run_all(jobs: Sequence[Job], workers: int = 1, threads: int = 1, traces: Path | None = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Run]:
    """Every job's run, resuming from and appending to ``traces`` (JSON lines)."""
    done: dict[str, Run] = {}
    if traces is not None and traces.exists():
        for line in traces.read_text().splitlines():
            if line.strip():
                k, r = _run_from_json(line)
                done[k] = r
    todo = [j for j in jobs if j.key() not in done]
    resumed = len(done)
    t_start = time.perf_counter()

    def finished(key: str, run: Run, seconds: float) -> None:
        done[key] = run
        if traces is not None:
            with traces.open("a") as fh:
                fh.write(_run_to_json(key, run) + "\n")
        if progress is not None:
            progress(f"[{len(done) - resumed}/{len(todo)} {time.perf_counter() - t_start:.0f} s] {run.space} "
                     f"{run.mode} x{run.gpus} seed {run.seed}: {seconds:.1f} s")

    if workers <= 1 or len(todo) <= 1:
        _worker_init(threads)
        for job in todo:
            finished(*execute(job))
    else:
        import multiprocessing as mp

        # Spawned workers with one BLAS thread each: on a small machine two workers must
        # not fight over cores, since the suggestion latency they measure goes on the clock.
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        with mp.get_context("spawn").Pool(workers, initializer=_worker_init, initargs=(threads,)) as pool:
            for result in pool.imap_unordered(execute, todo):
                finished(*result)
    return done


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return float(np.mean(xs)) if xs else math.nan


def summarise(metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means over the seeds of one (space, mode, GPUs). A run that never reached a level
    counts with its whole run (a lower bound), and ``reached`` says how many did."""
    out: dict[str, Any] = {k: metrics[0][k] for k in ("space", "mode", "gpus")}
    out["seeds"] = len(metrics)
    for level in LEVELS:
        got = [m[f"to_{level}"] for m in metrics]
        out[f"reached_{level}"] = sum(g is not None for g in got)
        for what, whole in (("wall_s", "wall_s"), ("gpu_s", "gpu_s"), ("evals", "evals")):
            out[f"{what}_to_{level}"] = _mean(g[what] if g is not None else m[whole]
                                              for g, m in zip(got, metrics, strict=True))
    for k in ("busy", "evals", "wall_s", "gpu_s", "mean_batch", "latency_s"):
        out[k] = _mean(m[k] for m in metrics)
    out["gpu_s_per_eval"] = _mean(m["gpu_s_per_eval"] for m in metrics)
    out["gpu_s_per_eval_bound"] = _mean(m["gpu_s_per_eval_bound"] for m in metrics)
    return out


def _fmt_s(v: float, reached: int | None = None, seeds: int | None = None) -> str:
    if not math.isfinite(v):
        return "—"
    text = f"{v:.0f}" if v >= 10 else f"{v:.1f}"
    if reached is not None and seeds is not None and reached < seeds:
        text = f"≥{text} ({reached}/{seeds})"
    return text


def _label(s: dict[str, Any]) -> str:
    return s["mode"] if s["mode"].startswith(KT_PREFIX) else f"{s['mode']} ×{s['gpus']}"


def format_space_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["mode", "seeds", "wall→0.95 s", "wall→0.99 s", "GPU-s→0.95", "GPU-s→0.99", "evals→0.95",
            "evals→0.99", "GPU busy", "evals", "GPU-s/eval", "batch", "latency s"]
    lines = [f"### {rows[0]['space']}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in rows:
        n = s["seeds"]
        cells = [_label(s), str(n)]
        cells += [_fmt_s(s[f"wall_s_to_{lv}"], s[f"reached_{lv}"], n) for lv in LEVELS]
        cells += [_fmt_s(s[f"gpu_s_to_{lv}"], s[f"reached_{lv}"], n) for lv in LEVELS]
        cells += [f"{s[f'evals_to_{lv}']:.0f}" for lv in LEVELS]
        cells += [f"{s['busy']:.2f}", f"{s['evals']:.0f}", f"{s['gpu_s_per_eval']:.2f}", f"{s['mean_batch']:.1f}",
                  f"{s['latency_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare(summaries: Sequence[dict[str, Any]], gpus: Sequence[int],
            clairvoyant: Mapping[tuple[str, int], float] | None = None,
            random_expected: Mapping[str, float] | None = None) -> dict[str, Any]:
    """fleettune's batched Pods against Kernel Tuner's best strategy, per space and pool
    size, and the targets of issue #17. ``clairvoyant``: mean `clairvoyant_s` per (space,
    GPUs), the floor each wall-clock ratio is shown against. ``random_expected``:
    `random_expectation_s` per space; each ratio is also shown against Kernel Tuner's best
    with ``random_sample`` at that expectation instead of its mean over the seeds run."""
    by_space: dict[str, dict[str, dict[str, Any]]] = {}
    for s in summaries:
        by_space.setdefault(s["space"], {})[_label(s)] = s
    out: dict[str, Any] = {"per_gpus": {}}
    for g in gpus:
        rows = []
        for space, modes in by_space.items():
            kt = [s for s in modes.values() if s["mode"].startswith(KT_PREFIX)]
            ours = modes.get(f"batch ×{g}")
            if not kt or ours is None:
                continue
            kt_wall = min(kt, key=lambda s: s["wall_s_to_0.95"])
            kt_gpu = min(kt, key=lambda s: s["gpu_s_to_0.95"])
            pod = modes.get(f"pod ×{g}")
            floor = (clairvoyant or {}).get((space, g), math.nan)
            expected = (random_expected or {}).get(space, math.nan)
            others = [s["wall_s_to_0.95"] for s in kt if s["mode"] != KT_PREFIX + "random_sample"]
            kt_expected = min([*others, expected]) if math.isfinite(expected) else math.nan
            rows.append({
                "space": space,
                "batch_wall_s": ours["wall_s_to_0.95"], "batch_reached": ours["reached_0.95"],
                "pod_wall_s": pod["wall_s_to_0.95"] if pod else math.nan,
                "pod_ratio": pod["wall_s_to_0.95"] / kt_wall["wall_s_to_0.95"] if pod else math.nan,
                "kt_best": kt_wall["mode"][len(KT_PREFIX):], "kt_wall_s": kt_wall["wall_s_to_0.95"],
                "kt_reached": kt_wall["reached_0.95"], "seeds": ours["seeds"],
                "wall_ratio": ours["wall_s_to_0.95"] / kt_wall["wall_s_to_0.95"],
                "clairvoyant_s": floor, "clairvoyant_ratio": floor / kt_wall["wall_s_to_0.95"],
                "random_expected_s": expected, "kt_expected_s": kt_expected,
                "wall_ratio_expected": ours["wall_s_to_0.95"] / kt_expected,
                "batch_gpu_s": ours["gpu_s_to_0.95"], "kt_best_gpu": kt_gpu["mode"][len(KT_PREFIX):],
                "kt_gpu_s": kt_gpu["gpu_s_to_0.95"],
                "gpu_ok": ours["gpu_s_to_0.95"] <= kt_gpu["gpu_s_to_0.95"],
                "batch_evals": ours["evals_to_0.95"], "kt_evals": kt_wall["evals_to_0.95"],
                "batch_s_per_eval": ours["wall_s_to_0.95"] / max(ours["evals_to_0.95"], 1),
                "kt_s_per_eval": kt_wall["wall_s_to_0.95"] / max(kt_wall["evals_to_0.95"], 1),
                "gpu_s_per_eval": ours["gpu_s_per_eval"], "gpu_s_per_eval_bound": ours["gpu_s_per_eval_bound"],
                "per_eval_ok": ours["gpu_s_per_eval"] <= ours["gpu_s_per_eval_bound"],
            })
        if not rows:
            continue
        mean_ratio = _mean(r["wall_ratio"] for r in rows)
        # One space where a Kernel Tuner strategy is lucky (its first configurations hit
        # a rare near-optimum) can dominate a mean of ratios: the geometric mean and the
        # ratio of totals are printed beside it.
        entry: dict[str, Any] = {"rows": rows, "mean_wall_ratio": mean_ratio,
                                 "geomean_wall_ratio": float(np.exp(np.mean(np.log([r["wall_ratio"] for r in rows])))),
                                 "total_wall_ratio": sum(r["batch_wall_s"] for r in rows)
                                 / sum(r["kt_wall_s"] for r in rows),
                                 "mean_pod_ratio": _mean(r["pod_ratio"] for r in rows),
                                 "mean_clairvoyant_ratio": _mean(r["clairvoyant_ratio"] for r in rows),
                                 "mean_wall_ratio_expected": _mean(r["wall_ratio_expected"] for r in rows),
                                 "total_gpu_ratio": sum(r["batch_gpu_s"] for r in rows)
                                 / sum(r["kt_gpu_s"] for r in rows),
                                 "gpu_never_more": all(r["gpu_ok"] for r in rows),
                                 "gpu_misses": [r["space"] for r in rows if not r["gpu_ok"]],
                                 "per_eval_misses": [r["space"] for r in rows if not r["per_eval_ok"]]}
        if g in WALL_RATIO_TARGET:
            entry["wall_ratio_target"] = WALL_RATIO_TARGET[g]
            entry["wall_ratio_met"] = mean_ratio <= WALL_RATIO_TARGET[g]
        out["per_gpus"][str(g)] = entry
    return out


def format_summary(cmp: dict[str, Any], spaces: dict[str, TimedSpace], model: FleetModel) -> str:
    lines: list[str] = []
    for g, entry in cmp["per_gpus"].items():
        lines += [f"### Summary, {g} GPU{'s' if g != '1' else ''}: batched Pods vs Kernel Tuner's best strategy "
                  "(1 GPU), to 0.95 of the optimum", ""]
        head = ["space", "batch wall s", "pod wall s", "KT best", "KT wall s", "wall ratio", "batch GPU-s",
                "KT GPU-s", "GPU-s ≤ KT", "evals batch/KT", "s/eval batch/KT", "GPU-s/eval (bound)"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in entry["rows"]:
            n = r["seeds"]
            lines.append("| " + " | ".join([
                r["space"].split(".")[0], _fmt_s(r["batch_wall_s"], r["batch_reached"], n), _fmt_s(r["pod_wall_s"]),
                r["kt_best"], _fmt_s(r["kt_wall_s"], r["kt_reached"], n), f"{r['wall_ratio']:.2f}",
                _fmt_s(r["batch_gpu_s"]), f"{_fmt_s(r['kt_gpu_s'])} ({r['kt_best_gpu']})",
                "yes" if r["gpu_ok"] else "**no**", f"{r['batch_evals']:.0f}/{r['kt_evals']:.0f}",
                f"{r['batch_s_per_eval']:.2f}/{r['kt_s_per_eval']:.2f}",
                f"{r['gpu_s_per_eval']:.2f} ({r['gpu_s_per_eval_bound']:.2f})"
                + ("" if r["per_eval_ok"] else " **over**"),
            ]) + " |")
        lines.append(f"| **mean** | | | | | {entry['mean_wall_ratio']:.2f} | | | | | | |")
        lines.append("")
        pod = entry["mean_pod_ratio"]
        lines.append(f"* wall-clock ratio to Kernel Tuner's best: mean {entry['mean_wall_ratio']:.3f}, geometric mean "
                     f"{entry['geomean_wall_ratio']:.3f}, ratio of totals {entry['total_wall_ratio']:.3f}"
                     + (f"; one configuration per Pod (pod mode): mean {pod:.3f}" if math.isfinite(pod) else ""))
        lines.append(f"* GPU-seconds to 0.95, ratio of totals over the spaces: {entry['total_gpu_ratio']:.3f}")
        floor = entry["mean_clairvoyant_ratio"]
        if math.isfinite(floor):
            lines.append(f"* a tuner that knew the answer (the first Pod's start-up, then the cheapest configuration "
                         f"at 0.95 alone): mean ratio {floor:.3f}; per space "
                         + ", ".join(f"{r['space'].split('.')[0]} {r['clairvoyant_ratio']:.3f}" for r in entry["rows"]))
        expected = entry["mean_wall_ratio_expected"]
        if math.isfinite(expected):
            lines.append(f"* with Kernel Tuner's random_sample at its exact expectation (every order of draws, no seed "
                         f"luck) instead of its mean over these seeds: mean ratio {expected:.3f}; random_sample "
                         "expected / measured s: "
                         + ", ".join(f"{r['space'].split('.')[0]} {_fmt_s(r['random_expected_s'])}"
                                     + (f" / {_fmt_s(r['kt_wall_s'])}" if r["kt_best"] == "random_sample" else "")
                                     for r in entry["rows"]))
        if "wall_ratio_target" in entry:
            lines.append(f"* target: wall-clock to 0.95 ≤ {entry['wall_ratio_target']:.3g} × Kernel Tuner's best, "
                         f"mean over spaces: {entry['mean_wall_ratio']:.3f} — "
                         f"{'met' if entry['wall_ratio_met'] else 'MISSED'}"
                         + (f" (the clairvoyant floor is {floor:.3f}: the target leaves "
                            f"{entry['wall_ratio_target'] / floor:.2f}× of it)" if math.isfinite(floor) else ""))
        lines.append("* target: GPU-seconds to 0.95 never more than Kernel Tuner's best: "
                     + ("met" if entry["gpu_never_more"] else "MISSED on " + ", ".join(entry["gpu_misses"])))
        lines.append(f"* target: GPU-seconds per evaluation ≤ {GPU_S_PER_EVAL_FACTOR} × recorded verification + "
                     "benchmark + start-up / batch: "
                     + ("met on every space" if not entry["per_eval_misses"]
                        else "MISSED on " + ", ".join(entry["per_eval_misses"])))
        for space in entry["per_eval_misses"]:
            lines.append("  * " + _why_per_eval(spaces.get(space), model))
        for r in entry["rows"]:
            if not r["gpu_ok"] or ("wall_ratio_target" in entry and r["wall_ratio"] > entry["wall_ratio_target"]):
                lines.append("  * " + _why_slow(r, spaces.get(r["space"]), model))
        lines.append("")
    return "\n".join(lines)


def _why_per_eval(ts: TimedSpace | None, model: FleetModel) -> str:
    if ts is None:
        return "?"
    ok = ~ts.compile_failed
    compile_per = float(np.median(ts.compile_s[ok])) / model.cpus
    gpu = float(np.median(ts.gpu_s(model.framework_on_gpu)[ok]))
    if compile_per > gpu:
        return (f"{ts.name}: compile-bound — median compile {np.median(ts.compile_s[ok]):.2f} s in {model.cpus} "
                f"processes = {compile_per:.2f} s per configuration > median GPU time {gpu:.3f} s: the GPU waits "
                "for compiles")
    return (f"{ts.name}: median GPU time {gpu:.3f} s, compile {compile_per:.3f} s per configuration in "
            f"{model.cpus} processes; the start-up dominates")


def _why_slow(r: dict[str, Any], ts: TimedSpace | None, model: FleetModel) -> str:
    parts = [f"{r['space']}: wall ratio {r['wall_ratio']:.2f}, GPU-s {r['batch_gpu_s']:.0f} vs {r['kt_gpu_s']:.0f}"]
    parts.append(f"evaluations to 0.95 {r['batch_evals']:.0f} vs {r['kt_evals']:.0f}")
    parts.append(f"seconds per evaluation {r['batch_s_per_eval']:.2f} vs {r['kt_s_per_eval']:.2f}")
    if ts is not None:
        ok = ~ts.compile_failed
        gpu = float(np.median(ts.gpu_s()[ok]))
        kt = float(np.median((ts.compile_s + ts.verify_s + ts.bench_s + ts.framework_s)[ok]))
        if gpu >= 0.7 * kt:
            parts.append(f"benchmark time dominates (median GPU {gpu:.2f} s of Kernel Tuner's {kt:.2f} s per "
                         "configuration): batching can only save the compile")
        elif kt < model.startup.p50_s:
            parts.append(f"cheap configurations (Kernel Tuner {kt:.2f} s each): a Pod start-up "
                         f"({model.startup.p50_s:g} s median) costs more than several evaluations")
    return "; ".join(parts)


def save_plots(runs: Sequence[Run], optima: dict[str, float], directory: Path) -> list[Path]:
    """One plot per space: mean fraction of optimum against wall-clock, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    by_space: dict[str, dict[str, list[Run]]] = {}
    for r in runs:
        label = r.mode if r.mode.startswith(KT_PREFIX) else f"{r.mode} ×{r.gpus}"
        by_space.setdefault(r.space, {}).setdefault(label, []).append(r)
    out = []
    for space, modes in by_space.items():
        ends = [r.end for rs in modes.values() for r in rs if r.end > 0]
        firsts = [float(r.times[0]) for rs in modes.values() for r in rs if len(r.times)]
        if not ends or not firsts:
            continue
        grid = np.geomspace(max(min(firsts) * 0.8, 1e-3), max(ends), 400)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, rs in sorted(modes.items()):
            ys = []
            for r in rs:
                t, f = curve(r, optima[space])
                pos = np.searchsorted(t, grid, side="right") - 1
                ys.append(np.where(pos >= 0, f[np.clip(pos, 0, None)] if len(f) else 0.0, 0.0))
            ax.plot(grid, np.mean(ys, axis=0), label=label, linestyle="--" if label.startswith(KT_PREFIX) else "-")
        ax.set_xscale("log")
        ax.set_xlabel("wall-clock (simulated seconds)")
        ax.set_ylabel("fraction of optimum (mean over seeds)")
        ax.set_ylim(0.5, 1.005)
        ax.set_title(space.split(".")[0])
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        path = directory / f"timeline-{space.split('.')[0]}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        out.append(path)
    return out


def _int_list(items: Sequence[str]) -> list[int]:
    return [int(v) for item in items for v in str(item).split(",") if v.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune bench timeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", action="append", default=[],
                   help="Kernel Tuner cache file (repeatable; default: every one in --spaces)")
    p.add_argument("--spaces", default=str(DEFAULT_SPACES), help="directory of recorded spaces (default %(default)s)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help="comma list of pod, batch, kernel_tuner:<strategy> (default %(default)s)")
    p.add_argument("--gpus", action="append", default=[], help="pool sizes, repeatable or comma list (default 1,4)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=220, help="evaluations per run")
    p.add_argument("--stop-at", type=float, default=0.99,
                   help="end a run once it reaches this fraction of the optimum (0 runs the whole budget)")
    p.add_argument("--strategy", default="bayes", help="fleettune's strategy for pod and batch")
    p.add_argument("--option", action="append", default=[], help="fleettune strategy option KEY=VALUE")
    p.add_argument("--startup-p50", type=float, default=2.0, help="Pod + CUDA start-up median, s")
    p.add_argument("--startup-p99", type=float, default=5.0, help="Pod + CUDA start-up 99th percentile, s")
    p.add_argument("--cpus", type=int, default=MAX_COMPILE_WORKERS,
                   help="compile processes of a batched Pod (default: the job image's most, %(default)s)")
    p.add_argument("--pod-seconds", type=float, default=60.0, help="GPU time a batched Pod aims at")
    p.add_argument("--max-batch", type=int, default=16)
    stream = p.add_mutually_exclusive_group()
    stream.add_argument("--stream-poll", type=float, default=0.0, metavar="S",
                        help="the operator reads running batched Pods' answers (their log lines) at every step, "
                             "stepping at least every S seconds (default 0: at each answer, as it does)")
    stream.add_argument("--no-stream", dest="stream_poll", action="store_const", const=None,
                        help="the operator learns a batched Pod's answers only when it ends "
                             "(FLEETTUNE_FOLLOW_ANSWERS=0)")
    p.add_argument("--prune-slower-than", type=float, default=PRUNE_SLOWER_THAN, metavar="F",
                   help=f"as the operator's kernel.pruneSlowerThan: stop benchmarking a configuration after "
                        f"{PRUNE_RUNS} runs whose median is over F x the best time known when its Pod was created, "
                        f"unverified; "
                        f"0: every run recorded (default: {PRUNE_SLOWER_THAN:g})")
    p.add_argument("--framework-on-gpu", action="store_true",
                   help="add Kernel Tuner's recorded framework time to every configuration's GPU time")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each measures its own latency)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--traces", help="JSON-lines file of finished runs: appended to, and resumed from")
    p.add_argument("--json", dest="json_out", help="write every run's metrics and the summary here")
    p.add_argument("--plot", help="directory for one best-so-far vs wall-clock plot per space")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p.parse_args(argv)


def _what_if(model: FleetModel) -> str:
    out = ""
    if model.stream_poll_s is None:
        out += ", answers read only when their Pod ends"
    elif model.stream_poll_s:
        out += f", answers read from running Pods every {model.stream_poll_s:g} s"
    if model.prune_slower_than != PRUNE_SLOWER_THAN:
        out += (f", benchmarks stopped after {PRUNE_RUNS} runs over {model.prune_slower_than:g} x the best"
                if model.prune_slower_than else ", no pruning")
    return out


def default_caches(directory: Path) -> list[str]:
    """The Kernel Tuner caches in ``directory`` (other formats, like the T4 copy, skipped)."""
    out = []
    for path in sorted(directory.glob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            head = fh.read(4096)
        if '"tune_params"' in head:
            out.append(str(path))
    return out


def main(argv: list[str]) -> int:
    from fleettune_dev.bench.strategy import parse_options

    args = parse_args(argv)
    caches = args.cache or default_caches(Path(args.spaces))
    if not caches:
        print(f"no Kernel Tuner caches given and none in {args.spaces}", file=sys.stderr)
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in FLEET_MODES and not (m.startswith(KT_PREFIX) and len(m) > len(KT_PREFIX)):
            print(f"--modes: unknown mode {m!r} (pod, batch, kernel_tuner:<strategy>)", file=sys.stderr)
            return 2
    gpus = _int_list(args.gpus) or [1, 4]
    options = parse_options(args.option, args.strategy)
    try:
        model = FleetModel(PodStartup(args.startup_p50, args.startup_p99), args.cpus, args.pod_seconds,
                           args.max_batch, args.framework_on_gpu, args.stream_poll, args.prune_slower_than)
    except ValueError as exc:
        print(f"fleettune bench timeline: {exc}", file=sys.stderr)
        return 2
    stop_at = args.stop_at if args.stop_at > 0 else None
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = []
    # Seed-major, so a run cut short (resumed from --traces) has about as many seeds everywhere.
    for seed in seeds:
        for path in caches:
            for mode in modes:
                for g in gpus if mode in FLEET_MODES else [1]:
                    jobs.append(Job(path, mode, g, seed, args.budget, model, args.strategy, options, stop_at))
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    traces = Path(args.traces) if args.traces else None
    resumed = len({j.key() for j in jobs} & set(_load_trace_keys(traces)))
    t0 = time.perf_counter()
    done = run_all(jobs, args.jobs, args.threads, traces, progress)
    elapsed = time.perf_counter() - t0
    spaces = {Path(p).name: _space(p) for p in caches}
    optima = {name: ts.replay.optimum for name, ts in spaces.items()}
    runs = [done[j.key()] for j in jobs]
    metrics = [run_metrics(r, optima[r.space]) for r in runs]
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for m in metrics:
        groups.setdefault((m["space"], m["mode"], m["gpus"]), []).append(m)
    summaries = [summarise(ms) for ms in groups.values()]
    print(f"fleettune bench timeline: {len(caches)} spaces, seeds {args.first_seed}..{seeds[-1]}, budget "
          f"{args.budget}, GPUs {gpus}, stop at {stop_at}; start-up p50 {model.startup.p50_s:g} s p99 "
          f"{model.startup.p99_s:g} s, {model.cpus} compile processes, Pods aim at {model.pod_seconds:g} s, "
          f"batches ≤ {model.max_batch}{', framework time on the GPU' if model.framework_on_gpu else ''}"
          f"{_what_if(model)}; "
          f"{len(jobs)} runs ({resumed} from --traces), {elapsed:.0f} s\n")
    for path in caches:
        rows = [s for s in summaries if s["space"] == Path(path).name]
        rows.sort(key=lambda s: (s["mode"].startswith(KT_PREFIX), s["mode"], s["gpus"]))
        print(format_space_table(rows) + "\n")
    floors = {(name, g): _mean(clairvoyant_s(ts, model, g, seed) for seed in seeds)
              for name, ts in spaces.items() for g in gpus}
    cmp = compare(summaries, gpus, floors, {name: random_expectation_s(ts) for name, ts in spaces.items()})
    print(format_summary(cmp, spaces, model))
    if args.plot:
        for p in save_plots(runs, optima, Path(args.plot)):
            print(f"plot: {p}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "params": {"caches": caches, "modes": modes, "gpus": gpus, "seeds": list(seeds), "budget": args.budget,
                       "stop_at": stop_at, "strategy": args.strategy, "options": options, "model": asdict(model)},
            "runs": metrics, "summary": summaries, "compare": cmp, "elapsed_s": elapsed,
        }, indent=2, default=float))
    return 0
