"""The tuning loop of one TuningRun.

Each step reconciles from what the cluster says, so the loop is resumable at any point:
finished Jobs are read and their records stored durably *before* the Jobs are deleted;
Jobs still running are adopted (their names are deterministic, and their configurations
count as pending); each pool's Study is rebuilt from the stored records after a
restart. Blocking API calls and model fitting run in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fleettune import metrics
from fleettune.api import TargetSpec, TargetStatus, TuningRunSpec, TuningRunStatus
from fleettune.controller.kube import Kube
from fleettune.jobs import TARGET_LABEL, TRIAL_LABEL, render_job, run_selector
from fleettune.results import TrialRecord, job_finished, record_from_job
from fleettune.status import run_status, target_status
from fleettune.store import ResultsStore, shard_name
from fleettune_job.protocol import TRIAL_ENV, Trial

GENERATION = 1  # results generation; a later change of kernel or space starts a new one
PRODUCT_LABELS = ("nvidia.com/gpu.product", "fleettune.dev/gpu.product")
NODE_RECHECK_S = 30.0


class SpecError(ValueError):
    """A spec the API server accepted but the operator cannot run; names the field."""


def field_path(loc: tuple[Any, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def parse_spec(raw: Mapping[str, Any]) -> TuningRunSpec:
    try:
        return TuningRunSpec.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpecError(f"{field_path(err['loc'])}: {err['msg']}") from None


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    # Timed inside the worker thread, so waiting for a free thread is not counted.
    started = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - started


def trial_of(job: dict[str, Any]) -> Trial:
    env = job["spec"]["template"]["spec"]["containers"][0].get("env") or []
    return Trial.from_env(next(e["value"] for e in env if e["name"] == TRIAL_ENV))


@dataclass
class Pool:
    """One target pool's search state."""

    spec: TargetSpec
    seed: int
    phase: str = "Pending"
    message: str = ""
    device: str = ""
    space: Any = None
    study: Any = None
    space_size: int | None = None
    default_key: str | None = None
    default_config: dict[str, Any] | None = None
    observed: set[int] = field(default_factory=set)
    next_check: float = 0.0

    @property
    def done(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class RunLoop:
    def __init__(self, kube: Kube, body: Mapping[str, Any], logger: logging.Logger | logging.LoggerAdapter) -> None:
        meta = body["metadata"]
        self.kube, self.body, self.log = kube, body, logger
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.store = ResultsStore(kube.core, self.namespace, self.name, self.uid)
        self.pools: dict[str, Pool] = {}
        self.spec: TuningRunSpec | None = None
        self.spec_generation: int | None = None
        self.spec_error: str | None = None
        self.last_status: dict[str, Any] | None = None
        self.loaded = False

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

    def _configure(self) -> None:
        """(Re)read the spec; new budgets and parallelism apply to existing pools."""
        self.spec_generation = self.generation
        try:
            self.spec = parse_spec(self.body["spec"])
            self.spec_error = None
        except SpecError as exc:
            self.spec, self.spec_error = None, str(exc)
            return
        for i, target in enumerate(self.spec.targets):
            pool = self.pools.get(target.name)
            if pool is None:
                self.pools[target.name] = Pool(spec=target, seed=self.spec.strategy.seed + 7919 * i)
            else:
                pool.spec = target
                if pool.phase == "Succeeded":
                    pool.phase = "Running"  # a larger budget re-opens a finished pool
        for gone in set(self.pools) - {t.name for t in self.spec.targets}:
            del self.pools[gone]
            metrics.forget_target(self.namespace, self.name, gone)

    def _setup_pool(self, pool: Pool, loop_time: float) -> None:
        """Find the pool's nodes and device, and build its search space and study (worker thread)."""
        from fleettune.optimize import Study
        from fleettune.space import SearchSpace, SpaceError, lookup_device

        assert self.spec is not None
        target = pool.spec
        product = target.device
        if target.node_selector:
            nodes = self.kube.list_nodes(_selector(target.node_selector))
            if not nodes:
                pool.phase, pool.next_check = "Unschedulable", loop_time + NODE_RECHECK_S
                pool.message = (
                    f"no node matches spec.targets[{target.name}].nodeSelector {_selector(target.node_selector)}"
                )
                return
            labels = nodes[0]["metadata"].get("labels", {})
            product = product or next((labels[k] for k in PRODUCT_LABELS if k in labels), None)
        pool.device = product or "unknown"
        device = lookup_device(product) if product else None
        params = [p.dump() for p in self.spec.parameters]
        try:
            space = SearchSpace.from_spec(params, list(self.spec.constraints), device)
            size = space.count()
        except SpaceError as exc:
            raise SpecError(f"spec.{exc}") from None
        if size == 0:
            raise SpecError("spec.constraints: no configuration satisfies the constraints on " + pool.device)
        default = self.spec.kernel.default_config
        if default is not None:
            try:
                row = space.to_rows([default])
            except SpaceError as exc:
                raise SpecError(f"spec.kernel.defaultConfig: {exc}") from None
            if not bool(space.is_valid(row)[0]):
                raise SpecError(f"spec.kernel.defaultConfig: violates the constraints on {pool.device}")
            pool.default_key, pool.default_config = space.key(default), default
        pool.space, pool.space_size = space, size
        pool.study = Study(space, strategy=self.spec.strategy.name, seed=pool.seed, options=self.spec.strategy.options)
        pool.observed = set()
        pool.phase, pool.message = "Running", ""

    # ------------------------------------------------------------------ one step

    async def step(self) -> bool:
        """Reconcile once; True when the run is finished (nothing left to do for this generation)."""
        if not self.loaded:
            await asyncio.to_thread(self.store.load)
            self.loaded = True
        if self.spec_generation != self.generation:
            self._configure()
        if self.spec is None:
            await self._write_status("Failed", [], "InvalidSpec", self.spec_error or "invalid spec")
            return True

        loop_time = asyncio.get_running_loop().time()
        for pool in self.pools.values():
            if pool.study is None and pool.phase != "Failed" and loop_time >= pool.next_check:
                try:
                    await asyncio.to_thread(self._setup_pool, pool, loop_time)
                except SpecError as exc:
                    self.spec_error = str(exc)
                    await self._write_status("Failed", [], "InvalidSpec", str(exc))
                    return True

        jobs = await asyncio.to_thread(self.kube.list_jobs, self.namespace, run_selector(self.name))
        running = await self._collect(jobs)
        await self._feed_studies()
        for pool in self.pools.values():
            if pool.study is not None and not pool.done:
                await self._advance(pool, running.get(pool.spec.name, []))
        return await self._report(running)

    async def _collect(self, jobs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        """Store the records of finished Jobs, then delete those Jobs; return the running ones per pool."""
        running: dict[str, list[dict[str, Any]]] = {}
        finished, fresh = [], []
        timings: dict[tuple[str, int], metrics.TrialTimings] = {}
        for job in jobs:
            labels = job["metadata"].get("labels", {})
            target, index = labels.get(TARGET_LABEL, ""), int(labels.get(TRIAL_LABEL, "-1"))
            if not job_finished(job):
                running.setdefault(target, []).append(job)
                continue
            finished.append(job)
            if (GENERATION, target, index) not in self.store:
                pods = await asyncio.to_thread(
                    self.kube.list_pods, self.namespace, f"batch.kubernetes.io/job-name={job['metadata']['name']}"
                )
                fresh.append(record_from_job(job, pods, trial_of(job).config, GENERATION))
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
        # Only now that the records are durable may the Jobs (and their Pods) go.
        for job in finished:
            await asyncio.to_thread(self.kube.delete_job, self.namespace, job["metadata"]["name"])
        return running

    async def _feed_studies(self) -> None:
        for pool in self.pools.values():
            if pool.study is None:
                continue
            new = [
                r for r in self.store.records
                if r.target == pool.spec.name and r.generation == GENERATION
                and r.index not in pool.observed and r.is_observation
            ]
            if new:
                await asyncio.to_thread(self._observe, pool, new)

    @staticmethod
    def _observe(pool: Pool, records: list[TrialRecord]) -> None:
        for rec in sorted(records, key=lambda r: r.index):
            pool.observed.add(rec.index)
            pool.study.observe(rec.config, rec.outcome, rec.objective, rec.times)

    def _pool_records(self, pool: Pool) -> list[TrialRecord]:
        return [r for r in self.store.records if r.target == pool.spec.name and r.generation == GENERATION]

    async def _advance(self, pool: Pool, running: list[dict[str, Any]]) -> None:
        assert self.spec is not None
        budget = self.spec.budget
        records = self._pool_records(pool)
        observations = sum(r.is_observation for r in records)
        infra = len(records) - observations
        if infra > budget.max_infra_failures:
            pool.phase = "Failed"
            pool.message = f"{infra} infrastructure failures (budget.maxInfraFailures={budget.max_infra_failures})"
            for job in running:
                await asyncio.to_thread(self.kube.delete_job, self.namespace, job["metadata"]["name"])
            return
        reason = None
        if observations >= budget.trials_per_target:
            reason = "budget spent"
        elif budget.patience is not None:
            reason = pool.study.should_stop(patience=budget.patience)
        if reason is not None:
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
            configs.append(pool.default_config)  # measured first: the baseline of the speed-up
        if want > len(configs):
            suggested, seconds = await asyncio.to_thread(
                _timed, pool.study.suggest, want - len(configs), pending + configs
            )
            configs += suggested
            metrics.suggestion_latency(self.namespace, self.name, pool.spec.name, seconds)
            fit_s = getattr(pool.study, "last_fit_s", None)
            if fit_s:
                metrics.model_fit(self.namespace, self.name, pool.spec.name, fit_s)
        if not configs and not running:
            pool.phase, pool.message = "Succeeded", "search space exhausted"
            return
        used = [r.index for r in records] + [int(j["metadata"]["labels"][TRIAL_LABEL]) for j in running]
        index = max(used, default=-1) + 1
        for config in configs:
            body = render_job(
                run=self.name, namespace=self.namespace, uid=self.uid, spec=self.spec, target=pool.spec,
                index=index, config=config, config_key=pool.space.key(config),
            )
            await asyncio.to_thread(self.kube.create_job, self.namespace, body)
            running.append(body)
            index += 1

    # ------------------------------------------------------------------ status

    async def _report(self, running: dict[str, list[dict[str, Any]]]) -> bool:
        assert self.spec is not None
        targets = [
            target_status(
                name=pool.spec.name, phase=pool.phase, budget=self.spec.budget.trials_per_target,
                records=self._pool_records(pool), running=len(running.get(pool.spec.name, [])),
                device=pool.device, space_size=pool.space_size, default_key=pool.default_key,
                message=pool.message,
            )
            for pool in self.pools.values()
        ]
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
            "configMapPrefix": shard_name(self.name, 0).rsplit("-", 1)[0],
            "shards": self.store.shards,
            "records": len(self.store.records),
        }
        status = run_status(
            previous=self._previous_status(), generation=self.generation, phase=phase, targets=targets,
            results=results, reason=reason, message=message,
        ).model_dump(by_alias=True, exclude_none=True, mode="json")
        metrics.observe_status(
            self.namespace, self.name, status, parallelism=self.spec.budget.parallelism if self.spec else None
        )
        if status == self.last_status:
            return
        await asyncio.to_thread(self.kube.patch_status, self.namespace, self.name, status)
        self.last_status = status


def is_settled(body: Mapping[str, Any]) -> bool:
    """A finished run whose spec has not changed since: nothing to do until it changes."""
    status = body.get("status") or {}
    return status.get("phase") in ("Succeeded", "Failed") and status.get("observedGeneration") == body[
        "metadata"
    ].get("generation")

