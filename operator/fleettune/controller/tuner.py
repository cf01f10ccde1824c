"""The tuning loop of one TuningRun: read the cluster, let the planner decide, apply.

Each step reconciles from what the cluster says, so the loop is resumable at any point:
finished Jobs are read and their records stored durably *before* the Jobs are deleted;
Jobs still running are adopted (their names are deterministic, and their configurations
count as pending); each pool's Study is rebuilt from the stored records after a restart,
and its round and fingerprint from the status. Blocking API calls and the planner (which
builds searches and fits models) run in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from fleettune import GROUP, KIND, VERSION
from fleettune.admission import TrialPolicy
from fleettune.api import TuningRunSpec, TuningRunStatus
from fleettune.controller.events import EventCorrelator
from fleettune.controller.kube import Kube
from fleettune.controller.observed import JobBody, ObservedJob, parse_job, seen
from fleettune.controller.plan import Observed, Plan, pods_needed
from fleettune.controller.planner import DEFAULT_NODE_WAIT_S, Planner
from fleettune.controller.publisher import Publisher, entries
from fleettune.controller.reporting import Report
from fleettune.jobs import run_selector
from fleettune.metrics import Metrics, TrialTimings
from fleettune.names import bounded
from fleettune.published import kernel_identity
from fleettune.results import Records, TrialRecord
from fleettune.store import MemoryReader, ResultsStore

__all__ = ["RunLoop"]

# Progress in a busy run's status (counters, bests) is written at most this often; the
# idle wake-up (handlers.IDLE_WAKEUP_S, the same 5 s) writes what a step held back.
STATUS_INTERVAL_S = 5.0
# How often the results store is listed again, to notice a shard deleted by hand (one
# being appended to is noticed at its next write).
RESULTS_CHECK_S = 30.0


class RunLoop:
    def __init__(
        self,
        kube: Kube,
        body: Mapping[str, Any],
        logger: logging.Logger | logging.LoggerAdapter[Any],
        node_epoch: Callable[[], int] = lambda: 0,
        metrics: Metrics | None = None,
        node_wait_s: float = DEFAULT_NODE_WAIT_S,
        policy: TrialPolicy | None = None,
        shared_namespaces: frozenset[str] = frozenset(),
    ) -> None:
        meta = body["metadata"]
        self.kube, self.body, self.log, self.node_epoch = kube, body, logger, node_epoch
        self.metrics = metrics if metrics is not None else Metrics.unregistered()
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.store = ResultsStore(kube.core, self.namespace, self.name, self.uid)
        self.memory = MemoryReader(kube.core, kube.custom)
        # The fleet's memory: this namespace's runs, and the shared namespaces' when it is one.
        shared = shared_namespaces if self.namespace in shared_namespaces else frozenset()
        self.memory_namespaces = sorted({self.namespace, *shared})
        self.planner = Planner(self.name, self.namespace, self.uid, logger, node_wait_s, policy)
        self.publisher = Publisher(kube, self.namespace, self.name, self.uid, logger)
        self.last_status: dict[str, Any] | None = None  # computed by the last step (written or held back)
        self.written: dict[str, Any] | None = None  # the last status written
        self.written_at = 0.0
        self.loaded = False
        self.results_checked = 0.0  # monotonic time of the store's last listing
        self.event_series = EventCorrelator()  # the Events this run wrote, to count repeats on

    @property
    def spec(self) -> TuningRunSpec | None:
        return self.planner.spec

    def configmaps_changed(self) -> None:
        """A ConfigMap of `configmaps_read` changed: read them again on the next step."""
        self.planner.source_changed()
        self.publisher.recheck()

    def configmaps_read(self) -> set[str]:
        """The ConfigMaps whose changes matter to the run: its kernel source, and a publish
        target it was refused (freed or deleted, it is taken at once). Not a target it
        publishes into: its own writes would wake it."""
        source = self.spec.kernel.user if self.spec is not None else None
        names = {source.config_map} if source is not None else set()
        if (refused := self.publisher.refused_name) is not None:
            names.add(refused)
        return names

    def _previous_status(self) -> TuningRunStatus | None:
        # Our own last write is fresher than the watched body, which may lag behind it.
        raw = self.last_status or self.body.get("status")
        if not raw:
            return None
        try:
            return TuningRunStatus.model_validate(dict(raw))
        except ValidationError:
            return None

    # ------------------------------------------------------------------ read

    async def step(self) -> bool:
        """Reconcile once; True when the run is finished (nothing left to do for this
        generation, no Job of it left to delete)."""
        planner, meta = self.planner, self.body["metadata"]
        if not self.loaded:
            await asyncio.to_thread(self.store.load)
            planner.restore(self._previous_status())
            self.loaded, self.results_checked = True, time.monotonic()
        elif time.monotonic() - self.results_checked >= RESULTS_CHECK_S:
            await asyncio.to_thread(self.store.load)
            self.results_checked = time.monotonic()
            self._note_lost()
        planner.configure(meta.get("generation"), self.body["spec"], self.store.records, time.time())
        if self.last_status is None and not self.body.get("status") and planner.spec is not None:
            # A status at once, before the first (possibly long) step: GitOps tools (kstatus,
            # Flux, Argo CD) read a run without one as done.
            await self._write_status(Report("Pending", [], "Initializing", "setting up the pools' searches"))
        for gone in planner.forgotten:
            self.metrics.forget_target(self.namespace, self.name, gone)
        planner.forgotten.clear()
        if planner.spec is not None and planner.wants_source(time.monotonic()):
            source = planner.spec.kernel.user
            assert source is not None
            data = await asyncio.to_thread(self.kube.read_config_map, self.namespace, source.config_map)
            planner.accept_source(data, time.monotonic(), time.time())
        if planner.wants_warm_start(time.monotonic()):
            assert planner.spec is not None and planner.spec.warm_start
            files = await asyncio.gather(*(asyncio.to_thread(self.kube.read_config_map, self.namespace, w.config_map)
                                           for w in planner.spec.warm_start))
            planner.accept_warm_start(files, time.monotonic())
        if (blocked := planner.blocked()) is not None:
            await self._write_status(blocked)
            return blocked.finished
        if planner.spec is not None and planner.spec.fleet_memory.retain_on_delete != self.store.retained:
            await asyncio.to_thread(self.store.retain, planner.spec.fleet_memory.retain_on_delete)
        if (kernel := planner.wants_memory(time.monotonic())) is not None:
            runs, problems = await asyncio.to_thread(self.memory.read, self.memory_namespaces, kernel, self.uid)
            planner.accept_memory(kernel, runs, problems, time.monotonic())
        planner.retune(meta.get("annotations") or {}, time.time())
        epoch = self.node_epoch()
        if planner.wants_nodes(epoch, time.monotonic()):
            nodes = await asyncio.to_thread(self.kube.list_fleet_nodes)
            planner.accept_nodes(nodes, epoch, time.monotonic())
        self.kube.watch_workers(self.namespace)
        bodies, jobs = await asyncio.to_thread(self._read_jobs)
        # A Job whose Pod's end (seen by the watch) decides it, before the Job controller says so.
        ended = {job.name: pod for job, body in zip(jobs, bodies, strict=True)
                 if not job.finished and (pod := self.kube.ended_pod(self.namespace, body)) is not None}
        needed = pods_needed(jobs, ended, self.store)
        pod_lists = await asyncio.gather(*(  # one round trip for all of them, not one after another
            asyncio.to_thread(self.kube.job_pods, self.namespace, job.name) for job in needed
        ))
        streamed = {job.name: answers for job in jobs if (answers := self.kube.streamed.of(self.namespace, job.uid))}
        pods = {job.name: listed for job, listed in zip(needed, pod_lists, strict=True)}
        observed = Observed(wall=time.time(), mono=time.monotonic(), jobs=seen(jobs, ended, pods, streamed),
                            records=self.store.records, stored=self.store)
        plan = await asyncio.to_thread(planner.plan, observed)
        await self._apply(plan)
        return plan.finished

    def _read_jobs(self) -> tuple[list[JobBody], list[ObservedJob]]:
        """The run's trial Jobs, and each parsed: the only place a step reads a Job's fields
        (in a worker thread, off the event loop: a large run has thousands)."""
        bodies = self.kube.list_jobs(self.namespace, run_selector(self.name))
        return bodies, [parse_job(body) for body in bodies]

    # ------------------------------------------------------------------ apply

    async def _apply(self, plan: Plan) -> None:
        await self._record_and_launch(plan)
        for s in plan.suggested:
            self.metrics.suggestion_latency(self.namespace, self.name, s.target, s.seconds)
            if s.fit_seconds is not None:
                self.metrics.model_fit_latency(self.namespace, self.name, s.target, s.fit_seconds)
        # The next trials first: the finished Jobs' records are durable, their deletion can
        # wait, and goes alongside the status (a Pod that ends meanwhile waits for both).
        await _all(self._delete_jobs(plan.delete_after), self._publish_and_report(plan))

    async def _publish_and_report(self, plan: Plan) -> None:
        spec = self.planner.spec
        assert spec is not None and plan.report is not None
        if plan.report.targets:  # publishing first: a refusal shows in the status written just after
            kernel = kernel_identity(self.planner.space_hash or "", self.planner.source.digest)
            best = entries(self.planner.pools.values(), Records([*self.store.records, *plan.early]), kernel)
            await self.publisher.publish(spec.publish, {t.name for t in spec.targets}, best, kernel,
                                         self.planner.reporter.predictions)
        await self._write_status(plan.report)

    async def _record_and_launch(self, plan: Plan) -> None:
        """Store the plan's records, delete `delete_now` and create the next trials."""
        if plan.delete_now:  # their records first, then the deletions, then the next trials
            await self._store(plan)
            await self._delete_jobs(plan.delete_now)
            await self._create_jobs(plan.create)
        else:
            # Only deleting a Job must wait for its records to be durable: the next trials
            # are created alongside the store's write, a round trip sooner on their GPUs.
            # (A crash in between leaves the finished Jobs, whose records are read again.)
            await _all(self._store(plan), self._create_jobs(plan.create))

    async def _store(self, plan: Plan) -> None:
        """The plan's records, durable before any Job they came from is deleted."""
        if not plan.records:
            return
        try:
            stored = await asyncio.to_thread(self.store.append, plan.records)
        finally:
            self._note_lost()  # a write to a shard deleted meanwhile finds it gone
        pods: dict[str, str] = {}  # Job name -> pool key, of the Pods whose records were stored
        for rec in stored:
            self._recorded(rec)
            pods[rec.job] = rec.target
        for job, target in pods.items():
            timings = plan.timings.get(job, TrialTimings())
            pool = self.planner.pools.get(target)
            self.metrics.pod_finished(self.namespace, self.name, target, timings.duration_s,
                                      timings.queue_wait_s, gpus=pool.spec.gpus if pool else 1,
                                      admission_wait_s=timings.admission_wait_s)

    def _note_lost(self) -> None:
        """Announce results shards deleted by hand: their records are gone, and the counts
        (status, budget) are those of the records that remain."""
        for name, lost in self.store.take_lost():
            self.planner.results_lost(lost)
            message = (f"results ConfigMap {name} was deleted: its {len(lost)} record(s) are lost; "
                       f"the {len(self.store.records)} that remain are counted")
            self.log.warning("%s", message)
            self.planner.events.append(("Warning", "ResultsLost", message))

    def _recorded(self, rec: TrialRecord) -> None:
        self.metrics.trial_recorded(self.namespace, self.name, rec.target, rec.outcome.value, rec.run_s,
                                    pruned=bool(rec.pruned))
        self.log.info(
            "trial %s/%d: %s%s", rec.target, rec.index, rec.outcome.value,
            f" {rec.objective:.4g} ms" if rec.objective else f" ({rec.error[:120]})" if rec.error else "",
        )
        if not rec.is_observation:
            # The cause, not the trial (its index is in the log line above): one Event per cause.
            self.planner.events.append(("Warning", "InfraFailure", f"{rec.target}: trial lost to the infrastructure: "
                                        f"{bounded(rec.error, 400) or 'no result'} (retried; not counted as a result)"))

    async def _create_jobs(self, jobs: list[JobBody]) -> None:
        await asyncio.gather(*(asyncio.to_thread(self.kube.create_job, self.namespace, b) for b in jobs))

    async def _delete_jobs(self, names: list[str]) -> None:
        await asyncio.gather(*(asyncio.to_thread(self.kube.delete_job, self.namespace, n) for n in names))

    async def _write_status(self, report: Report) -> None:
        spec = self.planner.spec
        published = self.publisher.condition() if spec is not None and spec.publish is not None else None
        status = self.planner.reporter.status(
            report, previous=self._previous_status(), body=self.body,
            results={"configMapPrefix": self.store.prefix, "shards": self.store.shards,
                     "records": len(self.store.records)},
            published=published, published_name=spec.publish.config_map_name if spec and spec.publish else None,
            extra=self.planner.status_fields(),
        )
        self.metrics.observe_status(self.namespace, self.name, status,
                                    parallelism=spec.budget.parallelism if spec else None)
        await self._post_events()
        written, self.last_status = self.written, status  # the next step carries this one over
        if status == written or not self._due(status):
            return
        try:
            await asyncio.to_thread(self.kube.patch_status, self.namespace, self.name, status)
        except ApiException as exc:
            if exc.status not in (400, 413, 422) and "too large" not in str(exc.body):
                raise
            # Refused (too large, or out of schema): a status that says so, rather than no
            # status and a traceback every step.
            generation = self.body["metadata"].get("generation")
            self.log.error("status of %s refused by the API server: %s", self.name, bounded(exc.body, 500))
            ready = {"type": "Ready", "status": "False", "reason": "StatusRejected",
                     "message": bounded(f"the status could not be written: {exc.reason}: {exc.body}"),
                     "observedGeneration": generation}
            status = {"phase": status.get("phase"), "observedGeneration": generation, "conditions": [ready]}
            self.last_status = status
            if status == written:
                return
            await asyncio.to_thread(self.kube.patch_status, self.namespace, self.name, status)
        self.written, self.written_at = status, time.monotonic()

    def _due(self, status: dict[str, Any]) -> bool:
        """Whether ``status`` is written now. What a user or a GitOps tool acts on (phase,
        conditions, observed generation, a pool's phase) is; counters and bests are at
        most STATUS_INTERVAL_S behind: a busy run's steps follow its Pods' ends, and a
        status write in each would hold the next reaction behind it. A run that goes
        quiet steps again within IDLE_WAKEUP_S and writes what was held back."""
        if self.written is None or time.monotonic() - self.written_at >= STATUS_INTERVAL_S:
            return True
        return status.get("phase") in ("Succeeded", "Failed") or _gist(status) != _gist(self.written)

    async def _post_events(self) -> None:
        events = self.planner.reporter.take_events()
        if not events:
            return
        meta = self.body["metadata"]
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": self.name,
                    "namespace": self.namespace, "uid": self.uid, "resourceVersion": meta.get("resourceVersion")}
        involved = {k: v for k, v in involved.items() if v}
        # A repeated cause updates its Event (count, lastTimestamp), as Kubernetes' recorder does.
        writes = self.event_series.correlate(events, time.monotonic())
        names = await asyncio.gather(*(asyncio.to_thread(self.kube.post_event, involved, w.type, w.reason, w.message,
                                                         count=w.count, name=w.name) for w in writes))
        for write, name in zip(writes, names, strict=True):
            self.event_series.written(write, name)


def _gist(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """What in a status is written at once (`RunLoop._due`)."""
    conditions = {c.get("type"): (c.get("status"), c.get("reason")) for c in status.get("conditions") or []}
    targets = [(t.get("name"), t.get("phase")) for t in status.get("targets") or []]
    return status.get("phase"), status.get("observedGeneration"), conditions, targets


async def _all(*steps: Coroutine[Any, Any, None]) -> None:
    """Run ``steps`` at once and wait for every one of them (none is left running behind a
    failure); then raise the first failure, if any."""
    for outcome in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome
