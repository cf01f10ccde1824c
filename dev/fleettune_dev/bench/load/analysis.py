"""The analysis of `fleettune bench load` (pure, on what was observed): reaction latencies,
the Job controller's and the scheduler's delays, the machine's load, fleet and GPU
utilisation, why GPUs were idle, and the audit of the results store.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from fleettune_dev.bench.load.observe import Observer, PodTimes
from fleettune_dev.bench.load.workload import NAMESPACE


class Reaction(NamedTuple):
    end: float  # when the trial Pod's end was seen
    seconds: float  # until the next Job of its run and pool was seen


def reaction_latencies(pods: dict[str, PodTimes],
                       jobs: dict[str, tuple[str, str, float, int | None]]) -> dict[str, list[Reaction]]:
    """Per pool: each trial Pod's end → the next Job created for the same run and pool (FIFO).

    "Next" is in the apiserver's order (resourceVersions) when every end and creation of
    the run and pool has one, in the order they were seen otherwise; the latency is the
    time between being seen, at least 0. The bench's Pod and Job watches lag each other
    under load: a Job the operator created promptly can be seen before the end it answers,
    and ordering by sight would pair that end with the Job after it, and every later end
    of the run and pool one Job late too."""
    finishes: dict[tuple[str, str], list[tuple[float, int | None]]] = defaultdict(list)
    creations: dict[tuple[str, str], list[tuple[float, int | None]]] = defaultdict(list)
    for p in pods.values():
        if p.finished is not None:
            finishes[(p.run, p.target)].append((p.finished, p.finished_rv))
    for run, target, created, rv in jobs.values():
        creations[(run, target)].append((created, rv))
    out: dict[str, list[Reaction]] = defaultdict(list)
    for key, ends in finishes.items():
        made = creations.get(key, [])
        causal = all(rv is not None for _, rv in ends + made)
        order: Callable[[tuple[float, int | None]], float] = (
            (lambda e: float(e[1] or 0)) if causal else (lambda e: e[0]))
        made = sorted(made, key=order)
        j = 0
        for end in sorted(ends, key=order):
            while j < len(made) and order(made[j]) < order(end):
                j += 1
            if j == len(made):
                break  # the budget is spent: no next Job
            out[key[1]].append(Reaction(end[0], max(0.0, made[j][0] - end[0])))
            j += 1
    return out


def job_controller_delays(obs: Observer) -> tuple[list[float], int]:
    """Trial Pod's end → its Job seen Complete/Failed (what waiting for the Job controller
    would add to the reaction; the operator reads a decisive verdict from the Pod), and how
    many ended Pods' Jobs were deleted before that."""
    out, ahead = [], 0
    for pod_uid, times in obs.pods.items():
        if times.finished is None:
            continue
        done = obs.jobs_done.get(obs.job_of_pod.get(pod_uid, ""))
        if done is None:
            ahead += 1
        elif done >= times.finished:
            out.append(done - times.finished)
    return out, ahead


def pod_waits(pods: dict[str, PodTimes]) -> tuple[list[float], list[float], int]:
    """Where a trial Pod waits before it runs: created → bound (the scheduler, and the pool
    being full), bound → Running (kwok); and how many Pods the scheduler found no GPU for."""
    scheduling = [p.bound - p.created for p in pods.values() if p.bound is not None and p.created is not None]
    starting = [p.started - p.bound for p in pods.values() if p.started is not None and p.bound is not None]
    return scheduling, starting, sum(p.unschedulable for p in pods.values())


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def cpu_jiffies(stat: str | None = None) -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat's first line: busy is
    everything but idle and iowait (guest time is already in user)."""
    line = (stat if stat is not None else Path("/proc/stat").read_text()).splitlines()[0]
    fields = [int(x) for x in line.split()[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(fields) - fields[3] - fields[4], sum(fields)


@dataclass
class CpuSampler:
    """The machine's CPU busy share over time (all cores), sampled every ``interval``
    seconds: whether a slow reaction coincided with a saturated machine."""

    interval: float = 0.5
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # (from, to, busy share)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name="bench-cpu").start()

    def _run(self) -> None:
        t0, (b0, n0) = time.time(), cpu_jiffies()
        while not self.stop.wait(self.interval):
            t1, (b1, n1) = time.time(), cpu_jiffies()
            if n1 > n0:
                self.samples.append((t0, t1, (b1 - b0) / (n1 - n0)))
            t0, b0, n0 = t1, b1, n1

    def busy(self, start: float, end: float) -> float:
        """Time-weighted busy share over [start, end] (NaN where nothing was sampled)."""
        weight = total = 0.0
        for a, b, share in self.samples:
            overlap = min(b, end) - max(a, start)
            if overlap > 0:
                weight, total = weight + overlap, total + overlap * share
        return total / weight if weight else float("nan")


SATURATED = 0.95  # busy share of all cores above which the machine counts as saturated


def reactions_by_load(reactions: list[Reaction], cpu: CpuSampler) -> dict[str, list[float]]:
    """The reactions' seconds split by whether the machine was saturated (`SATURATED`)
    while each took place (from the Pod's end to the next Job, at least one sample long)."""
    out: dict[str, list[float]] = {"saturated": [], "not saturated": []}
    for r in reactions:
        share = cpu.busy(r.end, r.end + max(r.seconds, cpu.interval))
        out["saturated" if share >= SATURATED else "not saturated"].append(r.seconds)
    return out


def quantiles(values: list[float]) -> dict[str, float]:
    return {"p50": quantile(values, 0.5), "p99": quantile(values, 0.99), "n": len(values)}


def utilisation(pods: dict[str, PodTimes], gpus: int) -> tuple[float, float, float]:
    """(overall, steady-state, wall seconds): busy GPU-seconds / (GPUs × window)."""
    spans = [(p.started, p.finished) for p in pods.values() if p.started is not None and p.finished is not None]
    if not spans:
        return 0.0, 0.0, 0.0
    t0, t1 = min(s for s, _ in spans), max(e for _, e in spans)

    def busy(a: float, b: float) -> float:
        return sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans)

    a, b = steady_window(pods)
    steady = busy(a, b) / (gpus * (b - a)) if b > a else float("nan")
    return busy(t0, t1) / (gpus * (t1 - t0)), steady, t1 - t0


def gpu_utilisation(pods: dict[str, PodTimes]) -> tuple[float, float, float]:
    """(GPU seconds the evaluations used, GPU seconds the trial Pods held from binding to
    their end, the share) over the Pods that ended with a readable result."""
    held = [(p.gpu_busy_s, p.finished - (p.bound if p.bound is not None else p.started))
            for p in pods.values() if p.gpu_busy_s is not None and p.finished is not None and p.started is not None]
    busy, allocated = sum(b for b, _ in held), sum(a for _, a in held)
    return busy, allocated, busy / allocated if allocated > 0 else float("nan")


def steady_window(pods: dict[str, PodTimes]) -> tuple[float, float]:
    """From the 10 % to the 90 % trial end: the fleet's steady state."""
    ends = sorted(p.finished for p in pods.values() if p.started is not None and p.finished is not None)
    return (ends[len(ends) // 10], ends[(9 * len(ends)) // 10]) if ends else (0.0, 0.0)


IDLE_CAUSES = ("kwok", "scheduler", "no Pod")


def idle_breakdown(pods: dict[str, PodTimes], capacity: dict[str, int],
                   window: tuple[float, float]) -> dict[str, float]:
    """Why GPUs sat idle in ``window``, as shares of all GPU-seconds: a Pod was bound to them
    but not yet Running (kwok), a Pod of the pool was waiting for a node (the scheduler, or
    its back-off after finding the pool full), or no Pod wanted one (the operator and the
    Job controller had not made the next one yet). Counted per pool, in that order."""
    a, b = window
    idle = dict.fromkeys(IDLE_CAUSES, 0.0)
    for pool, cap in capacity.items():
        # (time, Δwaiting for a node, Δbound not running, Δrunning); a stage not seen yet
        # ends with the next one seen, or never.
        events: list[tuple[float, int, int, int]] = []
        for p in pods.values():
            if p.target != pool or p.created is None:
                continue
            end = p.finished if p.finished is not None else math.inf
            start = p.started if p.started is not None else end
            bound = p.bound if p.bound is not None else start
            events += [(p.created, 1, 0, 0), (bound, -1, 1, 0), (start, 0, -1, 1), (end, 0, 0, -1)]
        events.sort()
        waiting = starting = running = 0
        last = a
        for t, dw, ds, dr in [*events, (b, 0, 0, 0)]:
            lo, hi = max(last, a), min(t, b)
            if hi > lo:
                free = max(0, cap - running)
                kwok = min(free, starting)
                sched = min(free - kwok, waiting)
                idle["kwok"] += kwok * (hi - lo)
                idle["scheduler"] += sched * (hi - lo)
                idle["no Pod"] += (free - kwok - sched) * (hi - lo)
            last = max(last, t)
            waiting, starting, running = waiting + dw, starting + ds, running + dr
    total = sum(capacity.values()) * (b - a)
    return {k: v / total for k, v in idle.items()} if total > 0 else idle


def audit(records: dict[str, list[Any]], answered: list[tuple[str, str, str, int]], budget: int,
          targets: list[str], in_flight: set[tuple[str, str, int]] | None = None) -> list[str]:
    """Losses and duplicates; ``in_flight``: trials whose Job still exists (a run cut short by --timeout),
    which are not losses and leave their pool short of its budget."""
    problems = []
    in_flight = in_flight or set()
    ran = Counter((run, t, i) for (ns, run, t, i) in answered if ns == NAMESPACE)
    twice = [k for k, n in ran.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} trials answered twice, e.g. {twice[:3]}")
    for run, recs in records.items():
        ids = Counter((r.target, r.index) for r in recs)
        dup = [k for k, n in ids.items() if n > 1]
        if dup:
            problems.append(f"{run}: {len(dup)} (target, index) recorded twice, e.g. {dup[:3]}")
        lost = {(t, i) for (r, t, i) in ran if r == run and (r, t, i) not in in_flight} - set(ids)
        if lost:
            problems.append(f"{run}: {len(lost)} trials ran but have no record, e.g. {sorted(lost)[:3]}")
        for target in targets if not in_flight else []:
            obs = sum(1 for r in recs if r.target == target and r.is_observation)
            if obs != budget:
                problems.append(f"{run}/{target}: {obs} observations, budget {budget}")
    return problems
