"""The tuning loop of one TuningRun.

Each step reconciles from what the cluster says, so the loop is resumable at any point:
finished Jobs are read and their records stored durably *before* the Jobs are deleted;
Jobs still running are adopted (their names are deterministic, and their configurations
count as pending); each pool's Study is rebuilt from the stored records after a
restart, and its round and fingerprint from the status. Blocking API calls and model
fitting run in worker threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from fleettune import GROUP, KIND, VERSION, metrics
from fleettune.admission import AdmissionError, TrialPolicy, check_node_selectors, check_trial_policy
from fleettune.api import TargetStatus, TuningRunSpec, TuningRunStatus
from fleettune.controller.kube import Kube
from fleettune.controller.pool import (
    Node,
    Pool,
    SpecError,
    build_search,
    check_options,
    compute_capability,
    current_fingerprint,
    make_study,
    matching_nodes,
    product_of,
    space_hash,
)
from fleettune.fingerprint import (
    NodeFingerprint,
    describe_change,
    eligibility_affinity,
    is_stale,
    pinning_selector,
)
from fleettune.jobs import TARGET_LABEL, TRIAL_LABEL, render_job, run_selector, target_key, target_of_key
from fleettune.kernelcheck import KernelSpecError, check_kernel, check_source_data, compile_check
from fleettune.names import bounded, short_hash
from fleettune.publish import PublishedEntry, not_ours, publish_plan, published_configmap
from fleettune.results import TrialRecord, job_finished, record_from_job
from fleettune.status import PUBLISH_REFUSED, TOP_K, fit_status, ranked, run_status, status_budget, target_status
from fleettune.store import ResultsStore
from fleettune_job.protocol import TRIAL_ENV, Trial

ROUND_LABEL = f"{GROUP}/round"
RETUNE_ANNOTATION = f"{GROUP}/retune-requested-at"
NODE_RECHECK_S = 30.0
SOURCE_RECHECK_S = 15.0
NODES_MAX_AGE_S = 15.0
PREDICT_EVERY_S = 30.0
PUBLISH_RECHECK_S = 60.0

__all__ = ["ROUND_LABEL", "RunLoop", "SpecError", "parse_spec"]


def field_path(loc: tuple[Any, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def parse_spec(raw: Mapping[str, Any]) -> TuningRunSpec:
    try:
        spec = TuningRunSpec.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpecError(f"{field_path(err['loc'])}: {err['msg']}") from None
    if not spec.kernel.sizes():  # the CRD's CEL rule says so; the model alone does not
        raise SpecError("spec.kernel.problemSize: set kernel.problemSize or kernel.problemSizes")
    return spec


def retune_key(token: str) -> str:
    """What status.lastHandledRetuneAt holds for a re-tune token: the token, or a hash of an
    annotation too long to repeat in the status (compared the same way after a restart)."""
    return token if len(token) <= 128 else f"sha256:{short_hash(token, 64)}"


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    # Timed inside the worker thread, so waiting for a free thread is not counted.
    started = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - started


def trial_of(job: dict[str, Any]) -> Trial:
    env = job["spec"]["template"]["spec"]["containers"][0].get("env") or []
    return Trial.from_env(next(e["value"] for e in env if e["name"] == TRIAL_ENV))


def round_of(job: dict[str, Any]) -> int:
    return int(job["metadata"].get("labels", {}).get(ROUND_LABEL, "1"))


def _epoch(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None
    except ValueError:
        return None


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


class RunLoop:
    def __init__(
        self,
        kube: Kube,
        body: Mapping[str, Any],
        logger: logging.Logger | logging.LoggerAdapter,
        node_epoch: Callable[[], int] = lambda: 0,
    ) -> None:
        meta = body["metadata"]
        self.kube, self.body, self.log, self.node_epoch = kube, body, logger, node_epoch
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.store = ResultsStore(kube.core, self.namespace, self.name, self.uid)
        self.pools: dict[str, Pool] = {}
        self.spec: TuningRunSpec | None = None
        self.spec_generation: int | None = None
        self.spec_error: str | None = None
        self.space_hash: str | None = None
        self.retune_token: str | None = None
        self.last_status: dict[str, Any] | None = None
        self.spec_reason = "InvalidSpec"
        # The published ConfigMap as last read or written: its data and resourceVersion (None:
        # there is none), when it was read, and why it may not be written (None: it may).
        self.published: dict[str, str] | None = None
        self.published_rv: str | None = None
        self.published_read: tuple[str, float] | None = None
        self.publish_problem: str | None = None
        self.publish_error: str | None = None  # the last attempt failed (retried)
        self.status_budget: tuple[Any, int] | None = None
        self.nodes: dict[str, Node] = {}
        self.nodes_read: tuple[int, float] | None = None
        # Per target: its nodes and fingerprint, until the nodes are read again (the sizes
        # of a target, and every step in between, share them).
        self.fleet_views: dict[str, tuple[list[Node] | None, Any]] = {}
        self.predictions: list[dict[str, Any]] = []
        self.predicted_for: tuple[Any, ...] | None = None
        self.loaded = False
        # A user kernel's source, read from its ConfigMap once per spec generation.
        self.source_text: str | None = None
        self.source_read_at = -SOURCE_RECHECK_S
        # SHA-256 of that source (trials carry it), and of a source that failed the checks:
        # the run waits for it to change rather than re-checking it every step.
        self.source_digest: str | None = None
        self.source_failed: str | None = None
        # Events to post with the next status write: (type, reason, message). Phases last
        # announced, per target and for the run ("" key), so a transition is said once.
        self.events: list[tuple[str, str, str]] = []
        self.announced: dict[str, str] = {}

    # ------------------------------------------------------------------ setup

    @property
    def generation(self) -> int | None:
        return self.body["metadata"].get("generation")

    def _previous_status(self) -> TuningRunStatus | None:
        # Our own last write is fresher than the watched body, which may lag behind it.
        raw = self.last_status or self.body.get("status")
        if not raw:
            return None
        try:
            return TuningRunStatus.model_validate(dict(raw))
        except ValidationError:
            return None

    async def _load(self) -> None:
        """After a (re)start: the stored records, and each pool's round and fingerprint."""
        await asyncio.to_thread(self.store.load)
        previous = self._previous_status()
        if previous is not None:
            self.space_hash = previous.space_hash
            self.source_digest = previous.source_digest
            self.retune_token = previous.last_handled_retune_at
            # After a restart, what the status already says was announced before.
            ready = next((c.reason for c in previous.conditions if c.type == "Ready"), "")
            self.announced = {t.name: t.phase for t in previous.targets} | {"": f"{previous.phase}/{ready}"}
        self._restored = {t.name: t for t in (previous.targets if previous else [])}
        self.loaded = True

    def _configure(self) -> None:
        """(Re)read the spec: budgets and parallelism apply at once; a new search space starts new rounds."""
        self.spec_generation = self.generation
        self.source_text, self.source_read_at, self.source_failed = None, -SOURCE_RECHECK_S, None
        try:
            self.spec = parse_spec(self.body["spec"])
            check_kernel(self.spec)
            self.spec_error = None
        except (SpecError, KernelSpecError) as exc:
            self.spec, self.spec_error, self.spec_reason = None, str(exc), "InvalidSpec"
            return
        try:
            check_node_selectors(self.spec)
            check_trial_policy(self.spec, TrialPolicy.from_env())
        except AdmissionError as exc:
            self.spec, self.spec_error, self.spec_reason = None, str(exc), exc.reason
            return
        new_hash = space_hash(self.spec)
        space_changed = self.space_hash is not None and new_hash != self.space_hash
        self.space_hash = new_hash
        sizes = self.spec.kernel.sizes()
        self.fleet_views.clear()  # node selectors may have changed
        wanted: list[str] = []
        for i, target in enumerate(self.spec.targets):
            keys = [target_key(target.name, size, len(sizes) > 1) for size in sizes]
            for j, (key, size) in enumerate(zip(keys, sizes, strict=True)):
                wanted.append(key)
                pool = self.pools.get(key)
                if pool is None:
                    pool = self.pools[key] = Pool(
                        spec=target, seed=self.spec.strategy.seed + 7919 * i + 613 * j, key=key,
                        problem_size=size, after=tuple(keys[:j]),
                    )
                    self._restore(pool)
                else:
                    pool.spec = target
                    if pool.phase == "Succeeded":
                        pool.phase = "Running"  # a larger budget re-opens a finished pool
                if space_changed:
                    self._new_round(pool, "the search space changed")
                elif pool.phase != "Failed":
                    pool.study = None  # rebuilt for the (possibly new) device limits and strategy
        for gone in set(self.pools) - set(wanted):
            metrics.forget_target(self.namespace, self.name, gone)
        self.pools = {key: self.pools[key] for key in wanted}  # spec order, which the status follows

    def _restore(self, pool: Pool) -> None:
        old = self._restored.get(pool.key)
        rounds = [r.generation for r in pool.records(self.store.records, all_rounds=True)]
        pool.round = max([old.round if old else 1, *rounds])
        if old is not None:
            if old.tuned_for is not None:
                pool.tuned_for = NodeFingerprint.from_status(old.tuned_for.dump())
            pool.stale = old.stale
            if old.phase in ("Succeeded", "Failed"):
                pool.phase, pool.message = old.phase, old.message
            pool.round_started = _epoch(old.round_started_at)

    def _new_round(self, pool: Pool, reason: str) -> None:
        pool.round += 1
        pool.round_started = time.time()
        pool.tuned_for = pool.current.fingerprint if pool.current is not None else None
        pool.stale, pool.study, pool.prior_dropped = None, None, False
        pool.phase, pool.message = "Running", f"round {pool.round}: {reason}"
        self.log.info("%s: %s", pool.key, pool.message)
        self.events.append(("Normal", "Retune", f"{pool.key}: {pool.message}"))

    async def _refresh_nodes(self) -> None:
        epoch, now = self.node_epoch(), time.monotonic()
        if self.nodes_read is not None and self.nodes_read[0] == epoch and now - self.nodes_read[1] < NODES_MAX_AGE_S:
            return
        nodes = await asyncio.to_thread(self.kube.list_nodes, "")
        self.nodes = {
            n["metadata"]["name"]: (n["metadata"].get("labels") or {}, bool(n.get("spec", {}).get("unschedulable")))
            for n in nodes
        }
        self.nodes_read = (epoch, now)
        self.fleet_views.clear()

    def _track_fleet(self, pool: Pool, loop_time: float) -> bool:
        """Update the pool's view of its nodes; False when it has none to run on."""
        assert self.spec is not None
        view = self.fleet_views.get(pool.spec.name)
        if view is None:
            nodes = matching_nodes(self.nodes, pool.spec)
            view = self.fleet_views[pool.spec.name] = (nodes, current_fingerprint(nodes, pool.spec))
        nodes, pool.current = view
        if nodes is not None and pool.current is None:
            if not pool.done:
                pool.phase = "Unschedulable"
                pool.next_check = loop_time + NODE_RECHECK_S
                why = "no node matches" if not nodes else "no eligible node (upgrading, cordoned or shared) among"
                selector = bounded(pool.spec.node_selector, 300)
                pool.message = f"{why} spec.targets[{pool.spec.name}].nodeSelector {selector}"
            return False
        if pool.phase == "Unschedulable":
            pool.phase, pool.message = "Running", ""
        current = pool.current.fingerprint if pool.current else None
        if pool.tuned_for is None and current is not None:
            pool.tuned_for = current
        if pool.current is not None and not pool.current.mixed and is_stale(pool.tuned_for, current):
            change = describe_change(pool.tuned_for, current)
            if self.spec.retune_policy == "OnDriverChange":
                self._new_round(pool, f"GPU fingerprint changed: {change}")
            elif pool.stale != change:
                pool.stale = change
                self.log.warning("%s is stale: %s (retunePolicy Manual)", pool.key, change)
        return True

    def _retune_requested(self) -> None:
        token = (self.body["metadata"].get("annotations") or {}).get(RETUNE_ANNOTATION)
        if token and retune_key(token) != self.retune_token:
            if self.retune_token is not None or self.last_status is not None or self._restored:
                for pool in self.pools.values():
                    if pool.phase != "Unschedulable":
                        self._new_round(pool, f"re-tune requested ({bounded(token, 64)})")
            self.retune_token = retune_key(token)

    # ------------------------------------------------------------------ one step

    async def step(self) -> bool:
        """Reconcile once; True when the run is finished (nothing left to do for this
        generation, no Job of it left to delete)."""
        if not self.loaded:
            await self._load()
        if self.spec_generation != self.generation:
            self._configure()
        if self.spec is None:
            await self._write_status("Failed", [], self.spec_reason, self.spec_error or "invalid spec")
            return True
        if self.spec.kernel.source is not None:
            problem = await self._read_source()
            if problem is not None:
                # The ConfigMap may be applied after the run (GitOps order): wait for it.
                await self._write_status("Pending", [], "SourceNotFound", problem)
                return False
            if self.source_failed == self.source_digest:
                # It did not compile: wait (polling) for the user to fix it.
                await self._write_status("Failed", [], "InvalidSpec", self.spec_error or "invalid kernel source")
                return False
        self._retune_requested()
        await self._refresh_nodes()
        loop_time = asyncio.get_running_loop().time()
        for pool in self.pools.values():
            if not self._track_fleet(pool, loop_time) or pool.phase == "Failed":
                continue
            if pool.study is None and (waiting := self._earlier_sizes_running(pool)):
                pool.phase, pool.message = "Pending", f"waiting for {waiting} to finish (warm start)"
                continue
            if pool.study is None and loop_time >= pool.next_check:
                try:
                    await asyncio.to_thread(self._setup_pool, pool)
                except SpecError as exc:
                    self.spec_error = str(exc)
                    await self._write_status("Failed", [], "InvalidSpec", str(exc))
                    return self.source_failed is None  # a kernel source that failed: poll for its fix
                except Exception as exc:  # never retry a broken pool forever: fail it, say why
                    self.log.exception("%s: cannot build its search", pool.key)
                    pool.phase, pool.message = "Failed", f"cannot build the search space: {exc}"[:500]

        jobs = await asyncio.to_thread(self.kube.list_jobs, self.namespace, run_selector(self.name))
        running, finished_jobs, settling = await self._collect(jobs)
        await self._feed_studies()
        for pool in self.pools.values():
            if pool.study is not None and not pool.done:
                await self._advance(pool, running.setdefault(pool.key, []))
        # The next trials first: the finished Jobs' records are durable, their deletion can wait.
        await self._delete_jobs(finished_jobs)
        await self._predict()
        # Publishing first: a refusal shows in the status written just after.
        await self._publish()
        finished = await self._report(running)
        # A recorded Job that the Job controller has not marked done yet is deleted on a
        # later step: poll for it rather than wait for a finished run's long wake-up.
        return finished and not settling

    def source_changed(self) -> None:
        """The source's ConfigMap changed: read it again at the next step."""
        self.source_read_at = -SOURCE_RECHECK_S

    async def _read_source(self) -> str | None:
        """(Re)read the user kernel's source, at most every SOURCE_RECHECK_S: the problem, or
        None. An edited source is another kernel: every pool starts a new round."""
        assert self.spec is not None and self.spec.kernel.source is not None
        now = time.monotonic()
        if now - self.source_read_at < SOURCE_RECHECK_S:
            return None if self.source_text is not None else self.spec_error or "waiting for the kernel source"
        self.source_read_at = now
        ref = self.spec.kernel.source
        data = await asyncio.to_thread(self.kube.read_config_map, self.namespace, ref.config_map)
        try:
            text = check_source_data(self.spec, data)
        except KernelSpecError as exc:
            self.source_text, self.spec_error = None, str(exc)
            return self.spec_error
        digest = hashlib.sha256(text.encode()).hexdigest()
        if self.source_digest is not None and digest != self.source_digest:
            for pool in self.pools.values():
                if self.source_failed is None:
                    self._new_round(pool, "the kernel source changed")
                else:  # the fix of a source that did not compile: this round never started
                    pool.phase, pool.message, pool.study = "Pending", "", None
            self.source_failed = None
        self.source_text, self.source_digest = text, digest
        if self.source_failed is None:  # else the compiler's message stays until the source changes
            self.spec_error = None
        return None

    async def _predict(self) -> None:
        """Recommendations for spec.predictFor from the tuned sizes, refreshed when results
        land (at most every PREDICT_EVERY_S while tuning, since each fits a GP)."""
        if self.spec is None or not self.spec.predict_for:
            self.predictions = []
            return
        sizes = [tuple(s) for s in self.spec.predict_for]
        basis = tuple((p.key, p.round, len(p.records(self.store.records))) for p in self.pools.values())
        now = time.monotonic()
        done = all(p.done for p in self.pools.values())
        last = self.predicted_for
        if last is not None and (last[0] == (basis, sizes) or (not done and now - last[1] < PREDICT_EVERY_S)):
            return
        self.predicted_for = ((basis, sizes), now)
        self.predictions = await asyncio.to_thread(self._predictions, sizes)

    def _predictions(self, sizes: list[tuple[int, ...]]) -> list[dict[str, Any]]:
        from fleettune.predict import observations, recommend

        assert self.spec is not None
        seed = self.spec.strategy.seed
        out: list[dict[str, Any]] = []
        by_target: dict[str, list[Pool]] = {}
        for pool in self.pools.values():
            by_target.setdefault(pool.spec.name, []).append(pool)
        for target, pools in by_target.items():
            space = next((p.space for p in pools if p.space is not None), None)
            records = {p.problem_size: observations(p.records(self.store.records)) for p in pools}
            for size in sizes:
                entry: dict[str, Any] = {"target": target, "problemSize": list(size)}
                if space is None or not any(v for recs in records.values() for _, v in recs):
                    entry["basis"] = "no valid result yet"
                else:
                    try:
                        rec = recommend(space, records, size, seed=seed)
                        entry.update(rec.as_dict())
                        entry["basis"] = entry["basis"][:200]
                    except ValueError as exc:  # e.g. a size with the wrong number of dimensions
                        entry["basis"] = f"spec.predictFor: {exc}"[:200]
                    except Exception as exc:  # a prediction must never stop the tuning
                        self.log.exception("%s: prediction for %s failed", target, size)
                        entry["basis"] = f"prediction failed: {exc}"[:200]
                out.append(entry)
        return out

    def _earlier_sizes_running(self, pool: Pool) -> str | None:
        """The first of the target's earlier sizes that has not finished, if any."""
        for key in pool.after:
            earlier = self.pools.get(key)
            if earlier is not None and not earlier.done:
                return key
        return None

    def _setup_pool(self, pool: Pool) -> None:
        """Search space for the pool's device and a Study warm-started from older rounds (worker thread)."""
        assert self.spec is not None
        check_options(self.spec)
        where = f"spec.targets[{[t.name for t in self.spec.targets].index(pool.spec.name)}]"
        build_search(self.spec, pool, product_of(pool, matching_nodes(self.nodes, pool.spec)), where)
        if self.source_text is not None:
            problem = compile_check(self.spec, self.source_text, compute_capability(pool), pool.problem_size)
            if problem is not None:
                self.source_failed = self.source_digest
                raise SpecError(f"{problem} (target {pool.key})")
        make_study(self.spec, pool, self.store.records)
        if pool.round_started is None:
            # A later size's round began with the target's first size: one deadline for all.
            earlier = [p.round_started for k in pool.after if (p := self.pools.get(k)) and p.round_started]
            pool.round_started = min(earlier, default=None) or time.time()
        if pool.phase in ("Pending", "Unschedulable"):
            pool.phase, pool.message = "Running", ""

    async def _collect(
        self, jobs: list[dict[str, Any]]
    ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
        """Store the records of finished Jobs, and of Jobs whose Pod's end already decides
        them (settling: neither running nor deletable until the Job controller is done with
        them); return the running Jobs per pool, the finished ones, which may be deleted now
        that their records are durable, and the settling ones."""
        running: dict[str, list[dict[str, Any]]] = {}
        finished, settling, unrecorded, fresh = [], [], [], []
        timings: dict[tuple[str, int], metrics.TrialTimings] = {}
        for job in jobs:
            labels = job["metadata"].get("labels", {})
            target, index = labels.get(TARGET_LABEL, ""), int(labels.get(TRIAL_LABEL, "-1"))
            pool = self.pools.get(target)
            ended = None
            if not job_finished(job) and (ended := self.kube.ended_pod(self.namespace, job)) is None:
                if pool is None or round_of(job) != pool.round:
                    # A trial of a removed pool, or of an older round (older driver or space),
                    # would only measure the past.
                    await asyncio.to_thread(self.kube.delete_job, self.namespace, job["metadata"]["name"])
                    continue
                running.setdefault(target, []).append(job)
                continue
            # Finished, or its Pod's end already decides it: no need to wait for the Job
            # controller to record it and start the next trial. Deleting it can wait: a Job
            # deleted before the Job controller is done with it leaves its Pod to the slower
            # orphan path (the tracking finalizer), and the Pod lingers.
            (finished if ended is None else settling).append(job)
            if (round_of(job), target, index) not in self.store:
                unrecorded.append((job, target, index, ended))
        # One round trip for all of them, not one after another.
        pod_lists = await asyncio.gather(*(self._pods_of(job, ended) for job, _, _, ended in unrecorded))
        for (job, target, index, _), pods in zip(unrecorded, pod_lists, strict=True):
            trial = trial_of(job)
            several = target != target_of_key(target)  # one of several problem sizes
            fresh.append(record_from_job(job, pods, trial.config, round_of(job),
                                         trial.problem_size if several else None))
            timings[(target, index)] = metrics.trial_timings(job, pods)
        if fresh:
            stored = await asyncio.to_thread(self.store.append, fresh)
            for rec in stored:
                t = timings.get((rec.target, rec.index), metrics.TrialTimings())
                metrics.trial_recorded(
                    self.namespace, self.name, rec.target, rec.outcome.value, t.duration_s, t.queue_wait_s
                )
                self.log.info(
                    "trial %s/%d: %s%s", rec.target, rec.index, rec.outcome.value,
                    f" {rec.objective:.4g} ms" if rec.objective else f" ({rec.error[:120]})" if rec.error else "",
                )
                if not rec.is_observation:
                    self.events.append(("Warning", "InfraFailure", f"{rec.target} trial {rec.index}: "
                                        f"{bounded(rec.error, 400) or 'no result'} (retried; not counted as a result)"))
        return running, finished, settling

    async def _pods_of(self, job: dict[str, Any], ended: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The Pods a Job's verdict is read from: its decisive Pod when the watch showed one."""
        if ended is not None:
            return [ended]
        selector = f"batch.kubernetes.io/job-name={job['metadata']['name']}"
        return await asyncio.to_thread(self.kube.list_pods, self.namespace, selector)

    async def _delete_jobs(self, jobs: list[dict[str, Any]]) -> None:
        await asyncio.gather(*(
            asyncio.to_thread(self.kube.delete_job, self.namespace, job["metadata"]["name"]) for job in jobs
        ))

    async def _feed_studies(self) -> None:
        for pool in self.pools.values():
            if pool.study is None:
                continue
            new = [r for r in pool.records(self.store.records) if r.index not in pool.observed and r.is_observation]
            if new:
                await asyncio.to_thread(self._observe, pool, new)

    @staticmethod
    def _observe(pool: Pool, records: list[TrialRecord]) -> None:
        for rec in sorted(records, key=lambda r: r.index):
            pool.observed.add(rec.index)
            pool.study.observe(rec.config, rec.outcome, rec.objective, rec.times)

    async def _stop(self, pool: Pool, running: list[dict[str, Any]], phase: str, message: str) -> None:
        await self._delete_jobs(running)
        running.clear()
        pool.phase, pool.message = phase, message

    async def _advance(self, pool: Pool, running: list[dict[str, Any]]) -> None:
        assert self.spec is not None
        budget = self.spec.budget
        records = pool.records(self.store.records)
        observations = sum(r.is_observation for r in records)
        infra = len(records) - observations
        if infra > budget.max_infra_failures:
            # The cause is in the Pods' results, which are gone with their Jobs: say it here.
            last = next((r.error for r in reversed(records) if not r.is_observation and r.error), "")
            await self._stop(pool, running, "Failed", f"{infra} infrastructure failures "
                             f"(budget.maxInfraFailures={budget.max_infra_failures})"
                             + (f"; the last: {bounded(last, 400)}" if last else ""))
            return
        elapsed = time.time() - (pool.round_started or time.time())
        if budget.deadline_seconds and elapsed > budget.deadline_seconds:
            await self._stop(pool, running, "Succeeded", f"deadline reached (budget.deadlineSeconds="
                             f"{budget.deadline_seconds})")
            return
        if observations >= budget.trials_per_target:
            # Reached (or lowered below) the budget: trials still running would only overspend it.
            await self._stop(pool, running, "Succeeded", "budget spent")
            return
        if budget.patience is not None and (reason := pool.study.should_stop(patience=budget.patience)):
            if not running:
                pool.phase, pool.message = "Succeeded", reason
            return
        want = min(budget.parallelism - len(running), budget.trials_per_target - observations - len(running))
        if want <= 0:
            return
        pending = [trial_of(j).config for j in running]
        configs: list[dict[str, Any]] = []
        keys = {r.key for r in records if r.is_observation} | {pool.space.key(c) for c in pending}
        if pool.default_config is not None and pool.default_key not in keys:
            configs.append(pool.default_config)  # measured first in every round: the speed-up's baseline
        if want > len(configs):
            try:
                suggested, seconds = await asyncio.to_thread(
                    _timed, pool.study.suggest, want - len(configs), pending + configs
                )
            except Exception as exc:  # a strategy that cannot suggest would fail the same way forever
                self.log.exception("%s: the strategy failed", pool.key)
                await self._stop(pool, running, "Failed", f"spec.strategy: the strategy failed: {exc}"[:500])
                return
            configs += suggested
            if not pool.prior_dropped and pool.study.prior_dropped:
                pool.prior_dropped = True
                note = (f"earlier results dropped after {pool.study.strategy.options['prior_patience']} "
                        "trials without improvement: tuning from this round's own")
                pool.message = f"{pool.message}; {note}" if pool.message else note
                self.log.info("%s: %s", pool.key, note)
            metrics.suggestion_latency(self.namespace, self.name, pool.key, seconds)
            fit_s = getattr(pool.study, "last_fit_s", None)
            if fit_s:
                metrics.model_fit(self.namespace, self.name, pool.key, fit_s)
        if not configs and not running:
            pool.phase, pool.message = "Succeeded", "search space exhausted"
            return
        all_records = pool.records(self.store.records, all_rounds=True)
        used = [r.index for r in all_records] + [int(j["metadata"]["labels"][TRIAL_LABEL]) for j in running]
        index = max(used, default=-1) + 1
        pin = pinning_selector(pool.tuned_for) if pool.tuned_for is not None else {}
        avoid = eligibility_affinity(pool.spec.allow_shared_gpus)
        bodies = []
        for i, config in enumerate(configs):
            body = render_job(
                run=self.name, namespace=self.namespace, uid=self.uid, spec=self.spec, target=pool.spec,
                index=index + i, config=config, config_key=pool.space.key(config), pin=pin, node_expressions=avoid,
                key=pool.key, problem_size=pool.problem_size, source_digest=self.source_digest,
            )
            body["metadata"]["labels"][ROUND_LABEL] = str(pool.round)
            bodies.append(body)
        await asyncio.gather(*(asyncio.to_thread(self.kube.create_job, self.namespace, b) for b in bodies))
        running.extend(bodies)

    # ------------------------------------------------------------------ status and publishing

    async def _report(self, running: dict[str, list[dict[str, Any]]]) -> bool:
        assert self.spec is not None
        targets = []
        # Many (pool, size) entries share the status: fewer top configurations each.
        top_k = TOP_K if len(self.pools) <= 8 else 2 if len(self.pools) <= 16 else 1
        for pool in self.pools.values():
            status = target_status(
                name=pool.key, phase=pool.phase, budget=self.spec.budget.trials_per_target,
                records=pool.records(self.store.records), running=len(running.get(pool.key, [])),
                device=pool.device, space_size=pool.space_size, default_key=pool.default_key,
                message=pool.message, tuning_round=pool.round, stale=pool.stale,
                tuned_for=pool.tuned_for.to_status() if pool.tuned_for else None, top_k=top_k,
            )
            update: dict[str, Any] = {"problem_size": list(pool.problem_size)}
            if pool.key != pool.spec.name:
                update["target"] = pool.spec.name
            if pool.round_started:
                update["round_started_at"] = _iso(pool.round_started)
            targets.append(status.model_copy(update=update))
        for t in targets:
            if self.announced.get(t.name, "Pending") != t.phase:
                self.announced[t.name] = t.phase
                kind = "Warning" if t.phase in ("Failed", "Unschedulable") else "Normal"
                self.events.append((kind, f"Target{t.phase}", f"{t.name}: {t.message or t.phase}"))
        finished = all(p.done for p in self.pools.values())
        if finished:
            failed = all(p.phase == "Failed" for p in self.pools.values())
            phase, reason = ("Failed", "AllTargetsFailed") if failed else ("Succeeded", "Tuned")
            message = "; ".join(f"{t.name}: {t.message}" for t in targets if t.message)
        else:
            phase, reason = "Running", "Tuning"
            stuck = [t for t in targets if t.phase == "Unschedulable"]
            message = "; ".join(t.message for t in stuck) or f"{sum(t.running for t in targets)} trials running"
        await self._write_status(phase, targets, reason, message)
        return finished

    async def _write_status(self, phase: str, targets: list[TargetStatus], reason: str, message: str) -> None:
        results = {
            "configMapPrefix": self.store.prefix,
            "shards": self.store.shards,
            "records": len(self.store.records),
        }
        extra = {
            "space_hash": self.space_hash,
            "source_digest": self.source_digest,
            "last_handled_retune_at": self.retune_token,
            "published": self.spec.publish.config_map_name if self.publish_condition() == (True, "Published", "")
            else None,
            "predictions": self.predictions,
        }
        status = run_status(
            previous=self._previous_status(), generation=self.generation, phase=phase, targets=targets,
            results=results, reason=reason, message=message, extra=extra, published=self.publish_condition(),
        ).model_dump(by_alias=True, exclude_none=True, mode="json")
        # Whatever the spec holds, the status must fit beside it in etcd: a status that
        # cannot be written shows nothing, not even why.
        if self.status_budget is None or self.status_budget[0] != self.generation:
            self.status_budget = (self.generation, status_budget(dict(self.body)))
        status = fit_status(status, self.status_budget[1])
        metrics.observe_status(
            self.namespace, self.name, status, parallelism=self.spec.budget.parallelism if self.spec else None
        )
        if self.announced.get("") != f"{phase}/{reason}":
            self.announced[""] = f"{phase}/{reason}"
            kind = "Warning" if phase == "Failed" or reason in ("InvalidSpec", "SourceNotFound") else "Normal"
            self.events.append((kind, reason, message))
        await self._post_events()
        if status == self.last_status:
            return
        try:
            await asyncio.to_thread(self.kube.patch_status, self.namespace, self.name, status)
        except ApiException as exc:
            if exc.status not in (400, 413, 422) and "too large" not in str(exc.body):
                raise
            # Refused (too large, or out of schema): a status that says so, rather than no
            # status and a traceback every step.
            self.log.error("status of %s refused by the API server: %s", self.name, bounded(exc.body, 500))
            ready = {"type": "Ready", "status": "False", "reason": "StatusRejected",
                     "message": bounded(f"the status could not be written: {exc.reason}: {exc.body}"),
                     "observedGeneration": self.generation}
            status = {"phase": status.get("phase"), "observedGeneration": self.generation, "conditions": [ready]}
            if status == self.last_status:
                return
            await asyncio.to_thread(self.kube.patch_status, self.namespace, self.name, status)
        self.last_status = status

    async def _post_events(self) -> None:
        events, self.events = self.events, []
        if not events:
            return
        meta = self.body["metadata"]
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": self.name,
                    "namespace": self.namespace, "uid": self.uid, "resourceVersion": meta.get("resourceVersion")}
        involved = {k: v for k, v in involved.items() if v}
        await asyncio.gather(*(asyncio.to_thread(self.kube.post_event, involved, kind, reason, message)
                               for kind, reason, message in events))

    def _entries(self) -> list[PublishedEntry]:
        assert self.spec is not None
        out = []
        for pool in self.pools.values():
            best = ranked(pool.records(self.store.records))
            if best:
                out.append(PublishedEntry(
                    pool=pool.spec.name, problem_size=pool.problem_size, config=best[0].config,
                    time_ms=best[0].objective, fingerprint=pool.tuned_for or NodeFingerprint(),
                    trial=best[0].index, generation=pool.round, measured_at=best[0].recorded_at,
                ))
        return out

    def publish_condition(self) -> tuple[bool, str, str] | None:
        """The `Published` condition: None when the run does not publish."""
        if self.spec is None or self.spec.publish is None:
            return None
        if self.publish_problem is not None:
            return False, PUBLISH_REFUSED, self.publish_problem
        if self.publish_error is not None:
            return False, "PublishFailed", self.publish_error
        if self.published_rv is None:
            return False, "NothingYet", "no result to publish yet"
        return True, "Published", ""

    async def _read_published(self, name: str) -> None:
        cm = await asyncio.to_thread(self.kube.get_config_map, self.namespace, name)
        self.published_read = (name, time.monotonic())
        self.publish_problem = not_ours(cm["metadata"], self.name) if cm is not None else None
        if cm is None or self.publish_problem is not None:
            self.published, self.published_rv = None, None
        else:
            self.published, self.published_rv = cm.get("data") or {}, cm["metadata"]["resourceVersion"]

    async def _publish(self) -> None:
        """Write the best configuration per pool to the named ConfigMap, only when it improves,
        and only into a ConfigMap this run created or publishes into (`publish.not_ours`):
        any other is left untouched and the refusal shown in the `Published` condition."""
        if self.spec is None or self.spec.publish is None:
            self.publish_problem = None
            return
        target = self.spec.publish
        name = target.config_map_name
        last = self.published_read
        try:
            # Read again now and then: the ConfigMap may have been deleted, or a refused name freed.
            if last is None or last[0] != name or time.monotonic() - last[1] > PUBLISH_RECHECK_S:
                await self._read_published(name)
            if self.publish_problem is not None:
                return
            data = publish_plan(self.name, self.published, self._entries(), pools={t.name for t in self.spec.targets})
            if data is None:
                self.publish_error = None
                return
            body = published_configmap(
                self.name, self.namespace, None if target.retain_on_delete else self.uid, [],
                name=name, run_uid=self.uid,
            )
            body["data"] = data
            # Only over the version read: a ConfigMap created or changed since is read (and
            # judged) again on the next step instead of being overwritten.
            rv = await asyncio.to_thread(self.kube.write_config_map, self.namespace, body, self.published_rv)
        except ApiException as exc:
            self.published_read = None
            if exc.status not in (404, 409):
                self.publish_error = f"writing ConfigMap {name}: {exc.status} {bounded(exc.reason, 200)}"
                self.log.warning("publishing to ConfigMap %s failed: %s", name, bounded(exc, 300))
            return
        except ValueError as exc:  # more than a ConfigMap holds
            self.publish_error = f"spec.publish.configMapName: {bounded(exc, 300)}"
            return
        self.published, self.published_rv, self.publish_error = data, rv, None
        self.log.info("published the best configurations to ConfigMap %s", name)


