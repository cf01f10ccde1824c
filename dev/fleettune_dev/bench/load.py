"""`fleettune bench load`: the operator under a simulated fleet's load, and a report.

Builds a local control plane with a fleet of N GPUs in P pools (KWOK nodes), starts the
fleet simulator and the operator (a subprocess, measured from /proc), applies R
TuningRuns (the convolution example on every pool, random strategy by default) whose
budgets add up to T trials, K configurations per trial Pod (``--trials-per-pod``, 1 by
default), waits for them to finish and prints:

* trials per minute; fleet utilisation (GPU-seconds holding a trial Pod between its
  start and end / GPUs × wall time), overall and in the steady state (10 %-90 % of
  trials), and why the steady state's idle GPUs were idle: a Pod bound to them not yet
  Running (kwok), a Pod of their pool waiting for a node (the scheduler), or no Pod at
  all (the operator and the Job controller);
* p50/p99 reaction latency: from a trial Pod finishing (seen on a watch) to the next Job
  the operator creates for the same run and pool (FIFO matching, the opening burst of
  each run excluded);
* operator CPU seconds and peak RSS (VmHWM), and the CPU of this process (simulator and
  observers, which share the machine with the control plane); the machine's CPU (busy
  share, time saturated, each control-plane component's seconds) and the reactions split
  by whether the machine was saturated while they took place; API requests per second and per
  evaluation (the apiserver's ``apiserver_request_total`` delta, every client included, over
  the configurations recorded) and the busiest verbs;
* GPU utilisation: the evaluations' GPU time (what each trial Pod reports as run time) over
  the GPU time the trial Pods held (bound to their end);
* the largest TuningRun object (JSON bytes, sampled during and after the run);
* an audit: the results store against the simulator's answers (no loss, no duplicate
  (target, index), each pool exactly at its budget).

Each figure is marked against its target (`TARGETS`; docs/bench-load.md says where they
come from and what was measured). Defaults are the full benchmark (300 GPUs, 3 pools, 20
runs, 10 000 trials); for a quick run: ``fleettune bench load --gpus 24 --runs 4 --trials
240 --trial-seconds 4``. ``--pod-startup`` has the simulator model each Pod's start-up
(p50 ≈ 2 s, p99 ≈ 5 s), the cost batching amortises.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from fleettune import GROUP, PLURAL, VERSION
from fleettune.labels import MANAGED_BY, MANAGER, POOL_LABEL, RUN_LABEL, TARGET_LABEL, TRIAL_LABEL
from fleettune_job.protocol import (
    CONTAINER_NAME,
    MAX_BATCH,
    TRIAL_ENV,
    ProtocolError,
    Trial,
    decode,
    decode_batch,
    parse_work,
)

NAMESPACE = "bench"
MANAGED = f"{MANAGED_BY}={MANAGER}"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "convolution-fleet.yaml"  # from a checkout
TARGETS = {"p99_latency_s": 2.0, "utilisation": 0.90, "rss_bytes": 1 << 30, "object_bytes": 64 << 10}


# ---------------------------------------------------------------------------- fleet and runs


def bench_fleet(gpus: int, pools: int, per_node: int) -> Any:
    """The demo fleet's pools (cycled), resized so the fleet has ``gpus`` GPUs in ``pools`` pools."""
    from fleettune_dev.cluster.fleet import Fleet, default_fleet

    demo = default_fleet()
    if gpus % (pools * per_node):
        raise SystemExit(f"--gpus {gpus} is not a multiple of pools × GPUs per node ({pools} × {per_node})")
    nodes = gpus // (pools * per_node)
    out = []
    for i in range(pools):
        src = demo.pools[i % len(demo.pools)]
        name = src.name if i < len(demo.pools) else f"{src.name}-{i}"
        out.append(src.model_copy(update={
            "name": name, "nodes": nodes, "gpu": src.gpu.model_copy(update={"per_node": per_node}),
            # Room for the trial Pods' CPU/memory requests next to every GPU.
            "resources": src.resources.model_copy(update={"cpu": str(max(16, per_node)), "memory": "256Gi"}),
        }))
    return Fleet(pools=out)


def example_run() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def run_manifests(fleet: Any, runs: int, trials: int, parallelism: int, strategy: str,
                  trials_per_pod: int = 1) -> list[dict[str, Any]]:
    base = example_run()
    by_pool = {t["name"]: t for t in base["spec"]["targets"]}
    pools = fleet.pool_names()
    per_target = math.ceil(trials / (runs * len(pools)))
    docs = []
    for i in range(runs):
        doc = copy.deepcopy(base)
        doc["metadata"] = {"name": f"load-{i:02d}", "namespace": NAMESPACE}
        spec = doc["spec"]
        spec["strategy"] = {"name": strategy, "seed": i}
        spec["budget"] = {"trialsPerTarget": per_target, "parallelism": parallelism, "trialTimeoutSeconds": 600,
                          "maxInfraFailures": 100, "trialsPerPod": trials_per_pod}
        targets = []
        for pool in pools:
            stem = pool.rsplit("-", 1)[0] if pool not in by_pool else pool
            target = copy.deepcopy(by_pool[stem])
            target["name"] = pool
            # Select by the pool label: extra pools copy another pool's GPU labels.
            target["nodeSelector"] = {POOL_LABEL: pool}
            targets.append(target)
        spec["targets"] = targets
        docs.append(doc)
    return docs


# ---------------------------------------------------------------------------- observation


@dataclass
class PodTimes:
    run: str
    target: str
    started: float | None = None
    finished: float | None = None
    created: float | None = None
    finished_rv: int | None = None  # resourceVersion of the update that ended it
    bound: float | None = None  # first seen with a node
    unschedulable: bool = False  # the scheduler found its pool full at least once
    gpu_busy_s: float | None = None  # GPU time its evaluations reported (None: no readable result)


@dataclass
class Observer:
    """Watches trial Pods and Jobs and records when each changed, in local wall-clock time."""

    api_factory: Any
    pods: dict[str, PodTimes] = field(default_factory=dict)
    # uid -> (run, target, created, resourceVersion when first seen: its creation's, seen ADDED)
    jobs: dict[str, tuple[str, str, float, int | None]] = field(default_factory=dict)
    jobs_done: dict[str, float] = field(default_factory=dict)  # uid -> when first seen Complete/Failed
    job_of_pod: dict[str, str] = field(default_factory=dict)  # pod uid -> job uid
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._watch, args=(kind,), daemon=True, name=f"bench-{kind}")
                   for kind in ("pods", "jobs")]
        for t in threads:
            t.start()
        return threads

    def _watch(self, kind: str) -> None:
        from kubernetes import client

        from fleettune_dev.sim.rawwatch import WatchExpired, raw_list, raw_watch

        api = self.api_factory()
        lister = (client.CoreV1Api(api).list_namespaced_pod if kind == "pods"
                  else client.BatchV1Api(api).list_namespaced_job)
        rv = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    items, rv = raw_list(lister, NAMESPACE, label_selector=MANAGED, _request_timeout=60)
                    for item in items:
                        self._seen(kind, item)
                for event, obj in raw_watch(lister, NAMESPACE, label_selector=MANAGED, resource_version=rv,
                                            timeout_seconds=5, allow_watch_bookmarks=True):
                    rv = obj["metadata"]["resourceVersion"]
                    if event in ("ADDED", "MODIFIED"):
                        self._seen(kind, obj)
                    if self.stop.is_set():
                        break
            except WatchExpired:
                rv = None
            except Exception as exc:  # keep watching through hiccups
                self.errors = [*self.errors[-20:], f"{kind}: {type(exc).__name__}: {exc}"]
                rv = None
                self.stop.wait(0.5)

    def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if kind == "jobs":
            self.jobs.setdefault(meta["uid"], (labels.get(RUN_LABEL, ""), labels.get(TARGET_LABEL, ""), now,
                                               revision(meta)))
            conditions = (obj.get("status") or {}).get("conditions") or []
            if meta["uid"] not in self.jobs_done and any(
                    c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions):
                self.jobs_done[meta["uid"]] = now
            return
        owner = next((o["uid"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "Job"), None)
        if owner:
            self.job_of_pod.setdefault(meta["uid"], owner)
        times = self.pods.setdefault(meta["uid"], PodTimes(labels.get(RUN_LABEL, ""), labels.get(TARGET_LABEL, "")))
        if times.created is None:
            times.created = now
        if (obj.get("spec") or {}).get("nodeName") and times.bound is None:
            times.bound = now
        if any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
               for c in (obj.get("status") or {}).get("conditions") or []):
            times.unschedulable = True
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Running" and times.started is None:
            times.started = now
        if phase in ("Succeeded", "Failed") and times.finished is None:
            times.finished = now
            times.finished_rv = revision(meta)
            if times.started is None:
                times.started = now
            times.gpu_busy_s = gpu_busy_seconds(termination_message(obj))


def job_trials(job: dict[str, Any]) -> list[int]:
    """The trial indexes a Job holds (a batch Job: each entry's), from its work; its trial
    label when the work cannot be read."""
    for container in job["spec"]["template"]["spec"]["containers"]:
        for env in container.get("env") or []:
            if env.get("name") == TRIAL_ENV:
                try:
                    work = parse_work(env.get("value") or "")
                except ValueError:
                    break
                return [work.index] if isinstance(work, Trial) else [e.index for e in work.entries]
    return [int(job["metadata"]["labels"][TRIAL_LABEL])]


def termination_message(pod: dict[str, Any]) -> str | None:
    """The trial container's termination message, once it has ended."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME:
            return ((status.get("state") or {}).get("terminated") or {}).get("message")
    return None


def gpu_busy_seconds(message: str | None) -> float | None:
    """GPU seconds a trial Pod's evaluations report (a batch: the sum of its answers'),
    None when the message is not a readable result."""
    try:
        return sum(a.r or 0.0 for a in decode_batch(message).answers)
    except ProtocolError:
        pass
    try:
        return decode(message).run_s or 0.0
    except ProtocolError:
        return None


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def apiserver_requests(api: Any) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (verb, resource)."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = api.call_api("GET", f"{api.configuration.host}/metrics", _request_timeout=30)
    resp.read()
    text = resp.data.decode()
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for s in family.samples:
            if s.name == "apiserver_request_total":
                out[(s.labels.get("verb", ""), s.labels.get("resource", ""))] += s.value
    return out


# ---------------------------------------------------------------------------- analysis


def revision(meta: dict[str, Any]) -> int | None:
    """An object's resourceVersion as a number: the local etcd's revision, one sequence for
    every kind, so it orders a Pod's end before the Job created on seeing it."""
    try:
        return int(meta.get("resourceVersion") or "")
    except ValueError:
        return None


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


# ---------------------------------------------------------------------------- the benchmark


@dataclass
class Report:
    gpus: int
    pools: int
    runs: int
    budget_per_target: int
    parallelism: int
    strategy: str
    trial_seconds: float
    trials_per_pod: int = 1
    pod_startup: bool = False
    trials_recorded: int = 0
    evaluations: int = 0  # records stored: one per configuration evaluated (infrastructure failures included)
    infra_failures: int = 0
    wall_s: float = 0.0
    trials_per_minute: float = 0.0
    latency_p50_s: float = float("nan")
    latency_p99_s: float = float("nan")
    latency_by_pool: dict[str, dict[str, float]] = field(default_factory=dict)
    latency_by_load: dict[str, dict[str, float]] = field(default_factory=dict)  # "saturated" / "not saturated"
    machine_busy: float = float("nan")  # mean busy share of all cores over the run
    machine_saturated: float = float("nan")  # share of the run with the machine saturated
    component_cpu_s: dict[str, float] = field(default_factory=dict)  # control-plane component -> CPU seconds
    job_controller_p50_s: float = float("nan")
    job_controller_p99_s: float = float("nan")
    job_controller_n: int = 0
    ahead_of_job_controller: int = 0
    scheduling_p50_s: float = float("nan")
    scheduling_p99_s: float = float("nan")
    starting_p50_s: float = float("nan")
    starting_p99_s: float = float("nan")
    unschedulable_pods: int = 0
    utilisation: float = 0.0
    utilisation_steady: float = 0.0
    idle_steady: dict[str, float] = field(default_factory=dict)  # cause -> share of GPU-seconds
    operator_cpu_s: float = 0.0
    operator_cpu_share: float = 0.0
    harness_cpu_s: float = 0.0  # this process: the fleet simulator and the observers
    operator_peak_rss_bytes: int = 0
    api_requests_per_s: float = 0.0
    api_requests_per_evaluation: float = float("nan")
    gpu_busy_s: float = 0.0
    gpu_allocated_s: float = 0.0
    gpu_utilisation: float = float("nan")
    api_top: list[tuple[str, float]] = field(default_factory=list)
    largest_run_bytes: int = 0
    suggestion_s: float = 0.0
    finished: bool = False
    audit: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    profile: list[str] = field(default_factory=list)

    def render(self) -> str:
        def mark(ok: bool) -> str:
            return "ok" if ok else "MISSED"

        gib = self.operator_peak_rss_bytes / (1 << 30)
        lines = [
            f"fleettune bench load: {self.gpus} GPUs in {self.pools} pools, {self.runs} runs × {self.pools} pools "
            f"× {self.budget_per_target} trials (parallelism {self.parallelism}, {self.strategy}, "
            f"~{self.trial_seconds:g} s per trial, {self.trials_per_pod} per Pod, "
            f"Pod start-up {'modelled' if self.pod_startup else 'not modelled'})",
            f"  finished:            {'yes' if self.finished else 'NO (timed out)'} in {self.wall_s:.0f} s",
            f"  trials recorded:     {self.trials_recorded} ({self.infra_failures} infrastructure failures)",
            f"  trials per minute:   {self.trials_per_minute:.0f}",
            f"  reaction p50 / p99:  {self.latency_p50_s:.2f} s / {self.latency_p99_s:.2f} s   "
            f"(target p99 < 2 s: {mark(self.latency_p99_s < TARGETS['p99_latency_s'])})",
        ]
        for pool, q in sorted(self.latency_by_pool.items()):
            lines.append(f"    {pool:<18} p50 {q['p50']:.2f} s  p99 {q['p99']:.2f} s  n={int(q['n'])}")
        for load, q in self.latency_by_load.items():
            lines.append(f"    machine {load + ':':<14} p50 {q['p50']:.2f} s  p99 {q['p99']:.2f} s  n={int(q['n'])}")
        lines.append(f"    Pod end → Job Complete/Failed (the Job controller; the operator reads the Pod instead): "
                     f"p50 {self.job_controller_p50_s:.2f} s, p99 {self.job_controller_p99_s:.2f} s "
                     f"(n={self.job_controller_n}; {self.ahead_of_job_controller} Jobs deleted before)")
        lines += [
            f"  fleet utilisation:   {self.utilisation:.1%} overall, {self.utilisation_steady:.1%} steady state   "
            f"(target > 90 %: {mark(self.utilisation_steady > TARGETS['utilisation'])})",
            f"    Pod created → bound p50 {self.scheduling_p50_s:.2f} s, p99 {self.scheduling_p99_s:.2f} s; "
            f"bound → Running p50 {self.starting_p50_s:.2f} s, p99 {self.starting_p99_s:.2f} s; "
            f"{self.unschedulable_pods} Pods found their pool full",
            "    idle GPU time in the steady state: " + ", ".join(
                f"{share:.1%} {cause}" for cause, share in self.idle_steady.items()),
            f"  GPU utilisation:     {self.gpu_utilisation:.2%} (evaluations' GPU time {self.gpu_busy_s:.0f} s "
            f"of {self.gpu_allocated_s:.0f} s held by trial Pods)",
            f"  operator CPU:        {self.operator_cpu_s:.0f} s ({self.operator_cpu_share:.0%} of one core); "
            f"the benchmark's own (simulator, observers): {self.harness_cpu_s:.0f} s",
            f"  machine CPU:         {self.machine_busy:.0%} busy ({os.cpu_count()} cores), saturated "
            f"(≥ {SATURATED:.0%}) {self.machine_saturated:.0%} of the run; control plane CPU: " + ", ".join(
                f"{name} {sec:.0f} s" for name, sec in self.component_cpu_s.items()),
            f"  operator peak RSS:   {gib:.2f} GiB   "
            f"(target < 1 GiB: {mark(self.operator_peak_rss_bytes < TARGETS['rss_bytes'])})",
            f"  suggestion time:     {self.suggestion_s:.1f} s in total (operator metrics)",
            f"  API requests/s:      {self.api_requests_per_s:.1f} (all clients); "
            f"{self.api_requests_per_evaluation:.1f} per evaluation ({self.evaluations} evaluations)",
            "    busiest: " + ", ".join(f"{k} {v:.1f}/s" for k, v in self.api_top[:6]),
            f"  largest TuningRun:   {self.largest_run_bytes / 1024:.1f} KiB   "
            f"(target < 64 KiB: {mark(self.largest_run_bytes < TARGETS['object_bytes'])})",
            f"  audit:               {'no trial lost or duplicated' if not self.audit else 'FAILED'}",
        ]
        lines += [f"    - {p}" for p in self.audit[:20]]
        if self.profile:
            lines.append("  where the operator's CPU goes (py-spy, inclusive share of samples):")
            lines += [f"    {p}" for p in self.profile]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _scrape_suggestion_seconds(port: int) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return float("nan")
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "fleettune_suggestion_duration_seconds_sum")


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the operator (``pip install py-spy``); None when it is not installed."""
    import shutil

    # Installed into the benchmark's own environment, whose bin/ need not be on PATH.
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        return None
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--output", str(out), "--format", "raw",
                             "--rate", "20", "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


# Frames that tell where the operator's time goes (its own code, kopf, the API client, JSON).
_PROFILE_KEEP = ("fleettune/", "kopf/", "kubernetes/", "urllib3/", "json/", "ssl.py", "gzip", "pydantic")
_PROFILE_SKIP = ("fleettune/cli.py", "fleettune/controller/run.py", "(fleettune/controller/handlers.py")


def summarise_profile(path: Path, top: int = 15) -> list[str]:
    """Inclusive share of samples per interesting function, from py-spy's collapsed stacks."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        for frame in set(stack.split(";")):
            if any(k in frame for k in _PROFILE_KEEP) and not any(k in frame for k in _PROFILE_SKIP):
                inclusive[frame] += n
    if not total:
        return []
    return [f"{n / total:6.1%}  {frame[:110]}" for frame, n in inclusive.most_common(top)]


def run_benchmark(args: argparse.Namespace) -> Report:
    from kubernetes import client

    from fleettune.crd import render
    from fleettune.labels import RESULTS_OF_LABEL
    from fleettune.store import DATA_KEY, decode_shard
    from fleettune_dev.cluster import LocalCluster
    from fleettune_dev.cluster.network import free_port
    from fleettune_dev.sim import FleetSimulator, PodStartup

    fleet = bench_fleet(args.gpus, args.pools, args.gpus_per_node)
    per_pool = args.gpus // args.pools
    parallelism = args.parallelism or max(1, math.ceil(args.oversubscribe * per_pool / args.runs))
    docs = run_manifests(fleet, args.runs, args.trials, parallelism, args.strategy, args.trials_per_pod)
    budget = docs[0]["spec"]["budget"]["trialsPerTarget"]
    report = Report(gpus=args.gpus, pools=args.pools, runs=args.runs, budget_per_target=budget,
                    parallelism=parallelism, strategy=args.strategy, trial_seconds=args.trial_seconds,
                    trials_per_pod=args.trials_per_pod, pod_startup=args.pod_startup)
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="fleettune-bench-"))
    say = (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)) if not args.quiet else (lambda m: None)
    cluster = LocalCluster(state / "cluster", fleet, die_with_parent=True)
    operator: subprocess.Popen[bytes] | None = None
    sim: FleetSimulator | None = None
    observer: Observer | None = None
    profiler: subprocess.Popen[bytes] | None = None
    cpu = CpuSampler()
    try:
        cluster.up(progress=say)
        crd = state / "crd.yaml"
        crd.write_text(render())
        cluster.kubectl("apply", "--server-side", "-f", str(crd))
        cluster.wait_established(f"{PLURAL}.{GROUP}")
        api = cluster.api_client()
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})

        # Trial time is all "compile": the recorded kernel times add milliseconds on top (a
        # batch Pod compiles ahead, as many at once as the job's compile pool takes).
        sim = FleetSimulator(cluster.kubeconfig, fleet, time_scale=1.0, compile_s=args.trial_seconds,
                             startup=PodStartup() if args.pod_startup else None).start()
        metrics_port = free_port()
        log = open(state / "operator.log", "wb")  # noqa: SIM115 (closed with the process)
        operator = subprocess.Popen(
            [sys.executable, "-m", "fleettune.cli", "operator", "-n", NAMESPACE, "--metrics-port",
             str(metrics_port), "--metrics-address", "127.0.0.1"],
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        observer = Observer(cluster.api_client)
        observer.start()
        time.sleep(3)  # the operator's start-up (imports) is not part of the run
        req0 = apiserver_requests(api)
        cpu0, harness0 = proc_cpu_seconds(operator.pid), time.process_time()
        pids = cluster.component_pids()
        cp0 = {name: proc_cpu_seconds(pid) for name, pid in pids.items()}
        cpu.start()
        t0 = time.time()
        for doc in docs:
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, doc)
        say(f"{len(docs)} TuningRuns applied: {budget} trials per pool each, parallelism {parallelism}")
        if args.profile:
            profiler = start_profiler(operator.pid, Path(args.profile))
            if profiler is None:
                report.notes.append("--profile: py-spy is not installed (pip install py-spy)")

        largest = 0
        deadline = time.monotonic() + args.timeout
        last_print = 0.0
        while time.monotonic() < deadline:
            if operator.poll() is not None:
                report.notes.append(f"the operator exited with {operator.returncode}; see {state / 'operator.log'}")
                break
            items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
            largest = max([largest, *(len(json.dumps(i, separators=(",", ":"))) for i in items)])
            phases = Counter((i.get("status") or {}).get("phase", "Pending") for i in items)
            done = sum((i.get("status") or {}).get("trials", {}).get("completed", 0) for i in items)
            if time.monotonic() - last_print > 15:
                say(f"{time.time() - t0:5.0f} s: {done} trials, runs {dict(phases)}, "
                    f"operator RSS {proc_peak_rss(operator.pid) / 2**20:.0f} MiB")
                last_print = time.monotonic()
            if phases.get("Succeeded", 0) + phases.get("Failed", 0) == len(docs):
                report.finished = True
                break
            time.sleep(2)
        wall = time.time() - t0
        cpu.stop.set()  # the run is over: what follows is the bench's own accounting
        report.wall_s = wall
        if operator.poll() is None:
            report.operator_cpu_s = proc_cpu_seconds(operator.pid) - cpu0
            report.operator_peak_rss_bytes = proc_peak_rss(operator.pid)
        report.operator_cpu_share = report.operator_cpu_s / wall if wall else 0.0
        report.harness_cpu_s = time.process_time() - harness0
        req = apiserver_requests(api)
        delta = Counter({k: req[k] - req0.get(k, 0.0) for k in req})
        report.api_requests_per_s = sum(delta.values()) / wall
        report.api_top = [(f"{verb} {res}", n / wall) for (verb, res), n in delta.most_common()]
        report.suggestion_s = _scrape_suggestion_seconds(metrics_port)

        items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
        report.largest_run_bytes = max([largest, *(len(json.dumps(i, separators=(",", ":"))) for i in items)])
        records: dict[str, list[Any]] = {}
        for doc in docs:
            name = doc["metadata"]["name"]
            cms = core.list_namespaced_config_map(NAMESPACE, label_selector=f"{RESULTS_OF_LABEL}={name}").items
            records[name] = [r for cm in cms for r in decode_shard((cm.binary_data or {})[DATA_KEY])]
        all_records = [r for recs in records.values() for r in recs]
        report.evaluations = len(all_records)
        if all_records:
            report.api_requests_per_evaluation = sum(delta.values()) / len(all_records)
        report.trials_recorded = sum(r.is_observation for r in all_records)
        report.infra_failures = sum(not r.is_observation for r in all_records)
        report.trials_per_minute = 60 * len(all_records) / wall if wall else 0.0
        in_flight: set[tuple[str, str, int]] = set()
        if not report.finished:
            # Cut short: trials still in a Job are not lost, and budgets cannot be checked.
            jobs = json.loads(client.BatchV1Api(api).list_namespaced_job(
                NAMESPACE, label_selector=MANAGED, _preload_content=False).data)["items"]
            in_flight = {(j["metadata"]["labels"][RUN_LABEL], j["metadata"]["labels"][TARGET_LABEL], index)
                         for j in jobs for index in job_trials(j)}
            report.notes.append(f"cut short by --timeout with {len(in_flight)} trials in flight: "
                                "the audit checks losses and duplicates, not budgets")
        report.audit = audit(records, list(sim.answered), budget, fleet.pool_names(), in_flight)

        lat = reaction_latencies(observer.pods, observer.jobs)
        every = [r for rs in lat.values() for r in rs]
        seconds = [r.seconds for r in every]
        report.latency_p50_s, report.latency_p99_s = quantile(seconds, 0.5), quantile(seconds, 0.99)
        report.latency_by_pool = {p: quantiles([r.seconds for r in rs]) for p, rs in lat.items()}
        report.latency_by_load = {k: quantiles(xs) for k, xs in reactions_by_load(every, cpu).items()}
        report.machine_busy = cpu.busy(t0, t0 + wall)
        report.machine_saturated = (sum(min(b, t0 + wall) - max(a, t0) for a, b, share in cpu.samples
                                        if share >= SATURATED and b > t0) / wall if wall else float("nan"))
        report.component_cpu_s = {name: proc_cpu_seconds(pid) - cp0.get(name, 0.0)
                                  for name, pid in pids.items() if Path(f"/proc/{pid}").exists()}
        report.utilisation, report.utilisation_steady, _ = utilisation(observer.pods, args.gpus)
        report.gpu_busy_s, report.gpu_allocated_s, report.gpu_utilisation = gpu_utilisation(observer.pods)
        capacity = {pool.name: pool.nodes * pool.gpu.per_node for pool in fleet.pools}
        report.idle_steady = idle_breakdown(observer.pods, capacity, steady_window(observer.pods))
        jc, report.ahead_of_job_controller = job_controller_delays(observer)
        report.job_controller_p50_s, report.job_controller_p99_s = quantile(jc, 0.5), quantile(jc, 0.99)
        report.job_controller_n = len(jc)
        scheduling, starting, report.unschedulable_pods = pod_waits(observer.pods)
        report.scheduling_p50_s, report.scheduling_p99_s = quantile(scheduling, 0.5), quantile(scheduling, 0.99)
        report.starting_p50_s, report.starting_p99_s = quantile(starting, 0.5), quantile(starting, 0.99)
        if observer.errors:
            report.notes.append(f"watch errors: {observer.errors[-1]}")
        if sim.errors:
            report.notes.append(f"simulator errors ({len(sim.errors)}): {sim.errors[-1]}")
        report.notes.append(f"operator log: {state / 'operator.log'}")
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            try:
                profiler.wait(timeout=60)
            except subprocess.TimeoutExpired:
                profiler.kill()
            if Path(args.profile).is_file():
                report.profile = summarise_profile(Path(args.profile))
                report.notes.append(f"py-spy profile (collapsed stacks): {args.profile}")
        api.close()
        return report
    finally:
        cpu.stop.set()
        if observer is not None:
            observer.stop.set()
        if profiler is not None and profiler.poll() is None:
            profiler.kill()
        if operator is not None and operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(operator.pid, signal.SIGKILL)
                operator.wait(timeout=10)
        if sim is not None:
            sim.stop()
        if not args.keep:
            cluster.down()
        else:
            print(f"[bench] kept: KUBECONFIG={cluster.kubeconfig}  (stop: fleettune cluster down "
                  f"--state-dir {cluster.state_dir})", file=sys.stderr)


def trials_per_pod(text: str) -> int:
    """``--trials-per-pod``: an integer within the protocol's batch limit."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= k <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be 1-{MAX_BATCH}")
    return k


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleettune bench load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=300, help="GPUs in the fleet (default 300)")
    parser.add_argument("--pools", type=int, default=3, help="node pools (default 3)")
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--runs", type=int, default=20, help="concurrent TuningRuns (default 20)")
    parser.add_argument("--trials", type=int, default=10_000, help="trials in total (default 10 000)")
    parser.add_argument("--trial-seconds", type=float, default=20.0,
                        help="simulated duration of one trial (default 20 s), all of it compile time: a "
                        "batch Pod compiles up to 4 configurations at once (the job's compile-ahead pool)")
    parser.add_argument("--trials-per-pod", type=trials_per_pod, default=1, metavar="K",
                        help=f"configurations each trial Pod measures (spec.budget.trialsPerPod, 1-{MAX_BATCH}; "
                        "default 1: one per Pod)")
    parser.add_argument("--pod-startup", action="store_true",
                        help="have the simulator model each Pod's start-up (interpreter, CUDA context: "
                        "p50 ≈ 2 s, p99 ≈ 5 s) before its first configuration")
    parser.add_argument("--strategy", default="random", choices=["random", "bayes", "genetic"])
    parser.add_argument("--parallelism", type=int, default=0,
                        help="trials at once per run and pool (default: enough to oversubscribe the pool)")
    parser.add_argument("--oversubscribe", type=float, default=1.25,
                        help="with the default parallelism: Jobs in flight per GPU of a pool (default 1.25)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds")
    parser.add_argument("--state-dir", default=None, help="where the cluster lives (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--json", default=None, help="also write the report as JSON to this file")
    parser.add_argument("--profile", default=None, metavar="FILE",
                        help="sample the operator with py-spy into FILE and report where its CPU goes")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    report = run_benchmark(args)
    print(report.render())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2, default=str))
    ok = (report.finished and not report.audit)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
