"""Prometheus metrics of the operator, served on ``:8080/metrics``.

One :class:`Metrics` object holds every family; the operator builds one at start-up
(:func:`operator_metrics`, with the process collectors) and hands it to each run's loop.
Tests build their own (``Metrics.unregistered()``) so they never see each other's samples.

Names follow Prometheus's conventions (``promtool check metrics`` passes on the live
``/metrics``): base units (seconds, not milliseconds), ``_total`` counters, ``_info`` info
metrics, ``_ratio`` ratios.

Labels are bounded on purpose: ``namespace``, ``run``, ``target`` (≤ 16 per run, from the
spec), ``outcome`` (the 7 protocol outcomes) and ``phase`` (the 4 run phases, the 5 pool
phases). The ``namespace`` label is the run's own: a scrape must keep it (the chart's
ServiceMonitor sets ``honorLabels: true``), or Prometheus renames it ``exported_namespace``. Never a
trial index, a Job name or a configuration: those would create a series per trial and
grow the scrape without bound. Per-trial detail lives in the results store and in
``fleettune report``.

Every series of a run is remembered so that they can be dropped when the run is deleted
(``Metrics.forget_run``); otherwise a long-lived operator would keep exporting dead runs
forever.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, get_args

import prometheus_client
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.metrics import MetricWrapperBase

from fleettune import __version__
from fleettune.api import TargetPhase
from fleettune_job.protocol import CONTAINER_NAME, Outcome

PREFIX = "fleettune"
DEFAULT_PORT = 8080
RUN_PHASES = ("Pending", "Running", "Succeeded", "Failed")
POOL_PHASES: tuple[str, ...] = get_args(TargetPhase)  # Pending, Running, Succeeded, Failed, Unschedulable

RUN_LABELS = ("namespace", "run")
POOL_LABELS = ("namespace", "run", "target")

# Trials last from well under a second (simulated fleet) to the 5-minute default timeout.
TRIAL_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
# Waiting for a node ranges from "instant" to "the pool is busy for hours".
QUEUE_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600, 14400)
# Suggesting and fitting run on the operator's CPU: milliseconds (random) to minutes (big GP).
COMPUTE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# `_created` samples double the series count and no dashboard uses them.
prometheus_client.disable_created_metrics()


@dataclass
class Metrics:
    """The operator's metric families, registered in one registry."""

    registry: CollectorRegistry
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # (namespace, run) -> {(metric, label values)}: what forget_run must remove.
    _series: dict[tuple[str, str], set[tuple[MetricWrapperBase, tuple[str, ...]]]] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def unregistered(cls) -> Metrics:
        """Metrics nobody scrapes: for a tuning loop run outside the operator (tests, tools)."""
        return cls(CollectorRegistry())

    def __post_init__(self) -> None:
        r = self.registry
        self.build_info = Info(f"{PREFIX}_build", "Version of the running operator.", registry=r)
        self.build_info.info({"version": __version__})
        self.trials = Counter(
            f"{PREFIX}_trials", "Trials recorded, by outcome (ok, the invalid-configuration "
            "outcomes, infra_error).", [*POOL_LABELS, "outcome"], registry=r,
        )
        self.pruned = Counter(
            f"{PREFIX}_trials_pruned", "Trials timed for 3 launches only, not verified: slower than "
            "kernel.pruneSlowerThan x the pool's best time so far (counted in trials_total as ok too).",
            POOL_LABELS, registry=r,
        )
        self.trial_duration = Histogram(
            f"{PREFIX}_trial_duration_seconds", "GPU time of one configuration (first launch to the end "
            "of its timing), as its trial Pod reports it.", POOL_LABELS, buckets=TRIAL_BUCKETS, registry=r,
        )
        self.pod_duration = Histogram(
            f"{PREFIX}_pod_duration_seconds", "Run time of a trial Pod's container (started to finished), "
            "whatever the number of configurations it measured.", POOL_LABELS, buckets=TRIAL_BUCKETS, registry=r,
        )
        self.gpu_busy = Counter(
            f"{PREFIX}_gpu_busy_seconds", "GPU seconds spent verifying and timing configurations (the "
            "sum of trial durations).", POOL_LABELS, registry=r,
        )
        self.gpu_held = Counter(
            f"{PREFIX}_gpu_allocated_seconds", "GPU seconds held by trial Pods (container run time x GPUs); "
            "busy / allocated is the pool's GPU utilisation.", POOL_LABELS, registry=r,
        )
        self.trials_per_pod = Gauge(
            f"{PREFIX}_pod_trials", "Configurations (trials) per trial Pod in the pool's latest Jobs.",
            POOL_LABELS, registry=r,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_trial_queue_wait_seconds", "Time from a trial Job's creation (or its admission by its "
            "Kueue queue) until its Pod was bound to a node of the pool.", POOL_LABELS, buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.admission_wait = Histogram(
            f"{PREFIX}_trial_admission_wait_seconds", "Time from a trial Job's creation until its Kueue queue "
            "admitted it (its last admission, after a preemption).", POOL_LABELS, buckets=QUEUE_BUCKETS, registry=r,
        )
        self.queued = Gauge(
            f"{PREFIX}_queued_trials", "Trials (configurations) whose Jobs wait for admission by their Kueue "
            "queue (suspended).", POOL_LABELS, registry=r,
        )
        self.best = Gauge(
            f"{PREFIX}_best_objective_seconds", "Best (lowest) kernel time found so far, in seconds "
            "(the status and reports show milliseconds).", POOL_LABELS, registry=r,
        )
        self.speedup = Gauge(
            f"{PREFIX}_speedup_ratio", "Default configuration's time divided by the best time.",
            POOL_LABELS, registry=r,
        )
        self.budget = Gauge(
            f"{PREFIX}_budget_trials", "Trials the pool may spend (spec.budget.trialsPerTarget).",
            POOL_LABELS, registry=r,
        )
        self.budget_used = Gauge(
            f"{PREFIX}_budget_used_trials", "Trials that counted against the budget (valid + invalid).",
            POOL_LABELS, registry=r,
        )
        self.in_flight = Gauge(
            f"{PREFIX}_trials_in_flight", "Trial Jobs (Pods) created and not yet finished; each measures "
            "one or a batch of configurations.", POOL_LABELS, registry=r,
        )
        self.parallelism = Gauge(
            f"{PREFIX}_trials_parallelism", "Trials the pool may run at once (spec.budget.parallelism).",
            POOL_LABELS, registry=r,
        )
        self.run_phase = Gauge(
            f"{PREFIX}_run_phase", "1 for the run's current phase, 0 for the others.",
            [*RUN_LABELS, "phase"], registry=r,
        )
        self.suggestion = Histogram(
            f"{PREFIX}_suggestion_duration_seconds", "Time the optimiser took to suggest a batch.",
            POOL_LABELS, buckets=COMPUTE_BUCKETS, registry=r,
        )
        self.model_fit = Histogram(
            f"{PREFIX}_model_fit_duration_seconds", "Time to fit the surrogate and feasibility models.",
            POOL_LABELS, buckets=COMPUTE_BUCKETS, registry=r,
        )
        self.pool_phase = Gauge(
            f"{PREFIX}_pool_phase", "1 for a pool's current phase (Unschedulable: no eligible node), "
            "0 for the others.", [*POOL_LABELS, "phase"], registry=r,
        )
        self.stale = Gauge(
            f"{PREFIX}_pool_stale", "1 while a pool's results are stale (its device fingerprint changed).",
            POOL_LABELS, registry=r,
        )
        self.fingerprint = Info(
            f"{PREFIX}_pool_fingerprint", "Device a pool's results were measured on.", POOL_LABELS, registry=r,
        )
        self.step_errors = Counter(
            f"{PREFIX}_reconcile_errors", "Tuning steps of a run that failed with an exception (retried).",
            RUN_LABELS, registry=r,
        )

    # ------------------------------------------------------------------ helpers

    def _child(self, metric: MetricWrapperBase, namespace: str, run: str, *rest: str) -> Any:
        values = (namespace, run, *rest)
        with self._lock:
            self._series.setdefault((namespace, run), set()).add((metric, values))
        return metric.labels(*values)

    # ------------------------------------------------------------------ API

    def trial_recorded(
        self,
        namespace: str,
        run: str,
        target: str,
        outcome: str,
        gpu_s: float | None = None,
        pruned: bool = False,
    ) -> None:
        """One trial's record was stored (call once per record, right after the store accepted
        it); `gpu_s`: the configuration's GPU time, when its Pod reported one; `pruned`: its
        timing stopped early (`kernel.pruneSlowerThan`)."""
        self._child(self.trials, namespace, run, target, str(Outcome(outcome).value)).inc()
        if pruned:
            self._child(self.pruned, namespace, run, target).inc()
        if gpu_s is not None and gpu_s >= 0:
            self._child(self.trial_duration, namespace, run, target).observe(gpu_s)
            self._child(self.gpu_busy, namespace, run, target).inc(gpu_s)

    def pod_finished(
        self, namespace: str, run: str, target: str, duration_s: float | None = None,
        queue_wait_s: float | None = None, gpus: int = 1, admission_wait_s: float | None = None,
    ) -> None:
        """A trial Pod's records were stored (call once per Job)."""
        if admission_wait_s is not None and admission_wait_s >= 0:
            self._child(self.admission_wait, namespace, run, target).observe(admission_wait_s)
        if duration_s is not None and duration_s >= 0:
            self._child(self.pod_duration, namespace, run, target).observe(duration_s)
            self._child(self.gpu_held, namespace, run, target).inc(duration_s * gpus)
        if queue_wait_s is not None and queue_wait_s >= 0:
            self._child(self.queue_wait, namespace, run, target).observe(queue_wait_s)

    def pool_progress(
        self,
        namespace: str,
        run: str,
        target: str,
        *,
        used: int,
        budget: int,
        in_flight: int,
        parallelism: int | None,
        best_ms: float | None,
        speedup: float | None = None,
    ) -> None:
        """The pool's gauges (observe_status calls this for every target of a status)."""
        self._child(self.budget_used, namespace, run, target).set(used)
        self._child(self.budget, namespace, run, target).set(budget)
        self._child(self.in_flight, namespace, run, target).set(in_flight)
        if parallelism is not None:
            self._child(self.parallelism, namespace, run, target).set(parallelism)
        if best_ms is not None:
            self._child(self.best, namespace, run, target).set(best_ms / 1000.0)
        if speedup is not None:
            self._child(self.speedup, namespace, run, target).set(speedup)

    def observe_status(
        self, namespace: str, run: str, status: Mapping[str, Any], *, parallelism: int | None = None
    ) -> None:
        """Every gauge of a run from its status (the camelCase dict written to the API server).

        One call after each status computation keeps the gauges in step with what users see in
        `kubectl get`; it also serves runs that are already finished when the operator starts.
        """
        self.set_run_phase(namespace, run, str(status.get("phase") or "Pending"))
        for t in status.get("targets") or []:
            name = t["name"]
            best = (t.get("best") or {}).get("objectiveMs")
            self.pool_progress(
                namespace, run, name, used=int(t.get("completed", 0)), budget=int(t.get("budget", 0)),
                in_flight=int(t.get("podsRunning", 0)) + int(t.get("podsPending", 0)), parallelism=parallelism,
                best_ms=best, speedup=t.get("speedup"),
            )
            self.set_pool_phase(namespace, run, name, str(t.get("phase") or "Pending"))
            self._child(self.queued, namespace, run, name).set(int(t.get("queued", 0)))
            if t.get("trialsPerPod"):
                self._child(self.trials_per_pod, namespace, run, name).set(int(t["trialsPerPod"]))
            # Exported as 0 too, so that `sum(fleettune_pool_stale)` is 0 rather than empty.
            self.pool_stale(namespace, run, name, bool(t.get("stale", False)))
            fp = t.get("fingerprint") or {}
            if fp.get("product"):
                self.fingerprint_info(
                    namespace, run, name, product=fp["product"], driver=fp.get("driverVersion", ""),
                    cuda=fp.get("cudaRuntimeVersion", ""), compute_capability=fp.get("computeCapability", ""),
                    simulated=bool(fp.get("simulated", False)),
                )

    def set_run_phase(self, namespace: str, run: str, phase: str) -> None:
        if phase not in RUN_PHASES:
            raise ValueError(f"unknown run phase {phase!r}")
        # Every phase is exported (0 or 1) so `sum by (phase)` never loses a series mid-run.
        for p in RUN_PHASES:
            self._child(self.run_phase, namespace, run, p).set(1.0 if p == phase else 0.0)

    def set_pool_phase(self, namespace: str, run: str, target: str, phase: str) -> None:
        if phase not in POOL_PHASES:
            raise ValueError(f"unknown pool phase {phase!r}")
        for p in POOL_PHASES:
            self._child(self.pool_phase, namespace, run, target, p).set(1.0 if p == phase else 0.0)

    def suggestion_latency(self, namespace: str, run: str, target: str, seconds: float) -> None:
        self._child(self.suggestion, namespace, run, target).observe(seconds)

    def model_fit_latency(self, namespace: str, run: str, target: str, seconds: float) -> None:
        self._child(self.model_fit, namespace, run, target).observe(seconds)

    def pool_stale(self, namespace: str, run: str, target: str, stale: bool) -> None:
        self._child(self.stale, namespace, run, target).set(1.0 if stale else 0.0)

    def fingerprint_info(
        self, namespace: str, run: str, target: str, *, product: str, driver: str, cuda: str,
        compute_capability: str = "", simulated: bool = False,
    ) -> None:
        # Info replaces the child's label values: a driver upgrade leaves one series, not two.
        self._child(self.fingerprint, namespace, run, target).info({
            "product": product, "driver": driver, "cuda": cuda,
            "compute_capability": compute_capability, "simulated": str(simulated).lower(),
        })

    def reconcile_error(self, namespace: str, run: str) -> None:
        self._child(self.step_errors, namespace, run).inc()

    def forget_target(self, namespace: str, run: str, target: str) -> None:
        """Drop the series of one pool (a target removed from the spec)."""
        self._forget(namespace, run, lambda values: len(values) > 2 and values[2] == target)

    def forget_run(self, namespace: str, run: str) -> None:
        """Drop every series of a deleted run."""
        self._forget(namespace, run, lambda values: True)

    def _forget(self, namespace: str, run: str, match: Any) -> None:
        with self._lock:
            series = self._series.get((namespace, run), set())
            gone = {s for s in series if match(s[1])}
            series -= gone
            if not series:
                self._series.pop((namespace, run), None)
        for metric, values in gone:
            with contextlib.suppress(KeyError):  # already gone: a deletion may be seen twice
                metric.remove(*values)

    def sample_names(self) -> set[str]:
        """Every sample name this registry can expose, whether or not a series exists yet."""
        return sample_names(self.registry)


def sample_names(registry: CollectorRegistry) -> set[str]:
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum"),
        "summary": ("", "_count", "_sum"),
        "info": ("_info",),
        "stateset": ("",),
        "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
        "unknown": ("",),
    }
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + s for s in suffixes[family.type])
        names.update(s.name for s in family.samples)
    return names


# ---------------------------------------------------------------------- timings


def parse_time(value: str | None) -> float | None:
    """Epoch seconds of a Kubernetes timestamp (RFC 3339), None when there is none."""
    when = _ts(value)
    return when.timestamp() if when is not None else None


def _ts(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True)
class TrialTimings:
    duration_s: float | None = None
    queue_wait_s: float | None = None
    admission_wait_s: float | None = None


def trial_timings(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> TrialTimings:
    """`pod_timings` of a finished trial's Job and Pods (pure)."""
    return pod_timings(*job_times(job), pods)


def job_times(job: Mapping[str, Any]) -> tuple[datetime | None, datetime | None]:
    """A trial Job's creation and last admission (Suspended turning False), for `pod_timings`."""
    created = _ts((job.get("metadata") or {}).get("creationTimestamp"))
    return created, max((when for c in (job.get("status") or {}).get("conditions") or []
                         if c.get("type") == "Suspended" and c.get("status") == "False"
                         and (when := _ts(c.get("lastTransitionTime")))), default=None)


def pod_timings(created: datetime | None, admitted: datetime | None, pods: Iterable[Mapping[str, Any]]) -> TrialTimings:
    """Run time, wait for admission and wait for a node of a finished trial, from its Job's
    creation and last admission (`job_times`) and its Pods (pure).

    Duration: the trial container's startedAt -> finishedAt in the last Pod that ran it.
    Admission wait (a Job of a Kueue queue): Job creation -> its last admission (the Job's
    Suspended condition turning False), a preemption's wait included. Queue wait: the Job's
    creation, or its admission, -> the first Pod's PodScheduled=True transition after it (a
    node was found); includes the Job controller's Pod creation, which is small next to a
    busy pool. Each is None when the objects do not say (e.g. a Pod that never started).
    """
    scheduled: list[datetime] = []
    runs: list[tuple[datetime, datetime]] = []
    for pod in pods:
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            when = _ts(cond.get("lastTransitionTime"))
            if cond.get("type") == "PodScheduled" and cond.get("status") == "True" and when:
                scheduled.append(when)
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            start, end = _ts(term.get("startedAt")), _ts(term.get("finishedAt"))
            if cs.get("name") == CONTAINER_NAME and start and end:
                runs.append((start, end))
    duration = None
    if runs:
        start, end = max(runs, key=lambda r: r[1])
        duration = max(0.0, (end - start).total_seconds())
    start = admitted or created
    wait = None
    if start and scheduled:
        bound = min((s for s in scheduled if s >= start), default=min(scheduled))
        wait = max(0.0, (bound - start).total_seconds())
    admission = max(0.0, (admitted - created).total_seconds()) if admitted and created else None
    return TrialTimings(duration, wait, admission)


# ---------------------------------------------------------------------- the operator's registry


def operator_metrics() -> Metrics:
    """The metrics of a running operator: its own families, and its process's CPU, memory
    and garbage collection (a slow suggestion is often a starved pod)."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return Metrics(registry)


def start_http_server(metrics: Metrics, port: int = DEFAULT_PORT, addr: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` from a daemon thread (never blocks kopf's event loop)."""
    return prometheus_client.start_http_server(port, addr=addr, registry=metrics.registry)
