"""The discrete-event simulator of `fleettune bench timeline`: the ``pod`` and ``batch``
modes on a pool of GPUs, the real `Study` suggesting.

`pod_answers` schedules one Pod (compiles ahead on its cores, the GPU in order);
`simulate_fleet` runs the pool: Pods start when a GPU is free and the operator's one
thread has suggested, and their answers reach the study when the Pod ends or, streamed,
as they are printed. Start-ups are drawn per seed (`startup_draws`) so that every mode of
a seed sees the same ones.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleettune.jobs import prune_above_ms
from fleettune_dev.bench.strategy import FAILURE_OUTCOME, Replay
from fleettune_dev.bench.timeline.model import FLEET_MODES, FleetModel, Run, TimedSpace
from fleettune_dev.sim.answer import pruned_result, scaled_runs
from fleettune_job.protocol import PRUNE_RUNS, Outcome
from fleettune_job.timing import pruned_after


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
    from fleettune.optimize import Study, split_settings
    from fleettune.optimize.batching import batch_size

    if mode not in FLEET_MODES:
        raise ValueError(f"unknown fleet mode {mode!r}")
    model = model or FleetModel()
    replay = ts.replay
    study = Study(replay.space, strategy=strategy, seed=seed, candidates=replay.rows,
                  **split_settings(strategy, options))  # options and tuning knobs (--option)
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
