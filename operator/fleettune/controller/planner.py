"""The decisions of one TuningRun's tuning loop (pure: no API calls; the time comes from the shell).

The I/O shell (`fleettune.controller.tuner`) reads the cluster and hands the planner what
it saw; the planner returns a `Plan` — records to store, Jobs to create and delete, events,
metric samples and the run's report — and the shell applies it. What the planner knows
between steps (each pool's round, phase and Study) it rebuilds from the stored records and
the last status after a restart, so the loop can resume from any point.

The planner follows the run's spec, re-tune token, kernel source and warm starts, keeps each
pool's nodes and search, and takes the step (`plan`): it collects what the Jobs say
(`controller.plan.collect`), then lets each pool start its next trials
(`controller.trials.advance`), and reports. It sees the Jobs decoded
(`controller.observed.ObservedJob`), never as dicts.

Reading is guided by the planner too (`wants_source`, `wants_warm_start`, `wants_nodes`, and
`plan.pods_needed`), so the shell reads only what a decision needs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from fleettune.admission import TrialPolicy
from fleettune.api import BudgetSpec, TuningRunSpec, TuningRunStatus
from fleettune.controller.fleet import (
    DEFAULT_NODE_WAIT_S,
    FleetView,
    compute_capability,
    product_of,
    waits_for_nodes,
)
from fleettune.controller.lifecycle import PoolPhase
from fleettune.controller.memory import FleetMemory, FleetPrior, kernel_id, outgrown, stamped
from fleettune.controller.observed import NodeBody
from fleettune.controller.plan import Observed, Plan, collect
from fleettune.controller.pool import Pool, build_search, make_study
from fleettune.controller.priors import WarmStarts
from fleettune.controller.reporting import Event, Report, Reporter
from fleettune.controller.source import KernelSource
from fleettune.controller.spec import SpecError, check_options, checked_spec, retune_key, space_hash
from fleettune.controller.trials import StepContext, advance, back_in_queue, pod_shares, pool_queue
from fleettune.fingerprint import describe_change, is_stale
from fleettune.kernelcheck import KernelSpecError, compile_check
from fleettune.labels import RETUNE_ANNOTATION
from fleettune.names import bounded
from fleettune.results import Records, StoredRun, TrialRecord
from fleettune.sizes import pool_key


def reopened(old: BudgetSpec | None, new: BudgetSpec) -> str:
    """The message of a finished pool that a spec edit opens again: what was raised."""
    raised = []
    if old is not None and new.trials_per_target > old.trials_per_target:
        raised.append(f"budget.trialsPerTarget raised from {old.trials_per_target} to {new.trials_per_target}")
    if old is not None and old.deadline_seconds is not None and (
            new.deadline_seconds is None or new.deadline_seconds > old.deadline_seconds):
        raised.append(f"budget.deadlineSeconds raised from {old.deadline_seconds} to {new.deadline_seconds or 'none'}")
    return f"{'; '.join(raised) or 'the spec changed'}: tuning again"


def drop_finished_studies(pools: Iterable[Pool]) -> None:
    """A finished run's loop lives until the run is deleted: its finished pools keep no
    model (a study holds its candidate set, tens of MiB for a large space), only their
    space and records. A new round or a larger budget builds one again."""
    for pool in pools:
        if pool.done:
            pool.study = None


class Planner:
    """One run's tuning decisions and the state they need between steps."""

    def __init__(self, name: str, namespace: str, uid: str, log: logging.Logger | logging.LoggerAdapter[Any],
                 node_wait_s: float = DEFAULT_NODE_WAIT_S, policy: TrialPolicy | None = None) -> None:
        self.name, self.namespace, self.uid, self.log = name, namespace, uid, log
        # The operator's settings, read once at its start (None: from the environment, per spec).
        self.node_wait_s, self.policy = node_wait_s, policy
        self.pools: dict[str, Pool] = {}
        self.spec: TuningRunSpec | None = None
        self.spec_generation: int | bool | None = False  # False: never configured
        self.spec_error: str | None = None
        self.spec_reason = "InvalidSpec"
        self.space_hash: str | None = None
        self.retune_token: str | None = None
        self.fleet = FleetView()
        self.source = KernelSource()
        self.warm = WarmStarts()  # spec.warmStart
        self.memory = FleetMemory()  # spec.fleetMemory: earlier runs' results of the kernel
        self.restored: dict[str, Any] = {}
        self.started = False  # past the run's first step (or restarted with a status)
        self.forgotten: list[str] = []  # pools removed from the spec, for the metrics to drop
        self.capacity_notes: dict[str, str] = {}  # pool key -> why it runs fewer Pods than its parallelism
        self.reporter = Reporter(log)

    @property
    def events(self) -> list[Event]:
        return self.reporter.events

    def status_fields(self) -> dict[str, Any]:
        """What the planner keeps in the status to resume from after a restart."""
        return {"space_hash": self.space_hash, "source_digest": self.source.digest,
                "last_handled_retune_at": self.retune_token}

    # ------------------------------------------------------------------ state from a restart

    def restore(self, previous: TuningRunStatus | None) -> None:
        """Round, fingerprint and phase of each pool, and what was announced, from the last status."""
        if previous is not None:
            self.space_hash = previous.space_hash
            self.source.digest = previous.source_digest
            self.retune_token = previous.last_handled_retune_at
            self.reporter.restore(previous)
            self.started = True
        self.restored = {t.name: t for t in (previous.targets if previous else [])}

    # ------------------------------------------------------------------ the spec

    def configure(self, generation: int | None, raw: Mapping[str, Any], records: Sequence[TrialRecord],
                  wall: float) -> None:
        """(Re)read the spec when its generation changed: budgets and parallelism apply at
        once; a new search space starts new rounds."""
        if self.spec_generation is not False and self.spec_generation == generation:
            return
        self.spec_generation = generation
        self.source.reset()
        self.warm.reset()
        self.memory.reset()
        old_budget = self.spec.budget if self.spec is not None else None
        try:
            spec = checked_spec(raw, self.policy)
        except SpecError as exc:
            self.spec, self.spec_error, self.spec_reason = None, str(exc), exc.reason
            return
        self.spec, self.spec_error = spec, None
        new_hash = space_hash(spec)
        space_changed = self.space_hash is not None and new_hash != self.space_hash
        self.space_hash = new_hash
        sizes = spec.kernel.sizes()
        self.fleet.views.clear()  # node selectors may have changed
        wanted: list[str] = []
        for i, target in enumerate(spec.targets):
            for j, size in enumerate(sizes):
                key = pool_key(target.name, size, len(sizes) > 1)
                wanted.append(key)
                pool = self.pools.get(key)
                if pool is None:
                    pool = self.pools[key] = Pool(spec=target, seed=spec.strategy.seed + 7919 * i + 613 * j, key=key,
                                                  problem_size=size)
                    pool.restore(self.restored.get(key), records)
                else:
                    pool.spec = target
                    if pool.phase == PoolPhase.SUCCEEDED:  # a larger budget re-opens a finished pool
                        pool.move(PoolPhase.RUNNING, reopened(old_budget, spec.budget))
                if space_changed:
                    self._new_round(pool, "the search space changed", wall)
                elif pool.phase != PoolPhase.FAILED:
                    pool.study = None  # rebuilt for the (possibly new) device limits and strategy
        self.forgotten += sorted(set(self.pools) - set(wanted))
        self.pools = {key: self.pools[key] for key in wanted}  # spec order, which the status follows

    def _new_round(self, pool: Pool, reason: str, wall: float) -> None:
        pool.round += 1
        pool.round_started = wall
        pool.tuned_for = pool.current.fingerprint if pool.current is not None else None
        pool.stale, pool.study, pool.prior_dropped, pool.requeue, pool.predicted = None, None, False, [], None
        pool.move(PoolPhase.RUNNING, f"round {pool.round}: {reason}")
        self.log.info("%s: %s", pool.key, pool.message)
        self.events.append(("Normal", "Retune", f"{pool.key}: {pool.message}"))

    def retune(self, annotations: Mapping[str, str], wall: float) -> None:
        """A new re-tune token starts a new round on every schedulable pool (a token a run
        carries from its first step is only noted: there is nothing to re-tune yet)."""
        token = annotations.get(RETUNE_ANNOTATION)
        if token and retune_key(token) != self.retune_token:
            if self.retune_token is not None or self.started or self.restored:
                for pool in self.pools.values():
                    if pool.phase != PoolPhase.UNSCHEDULABLE:
                        self._new_round(pool, f"re-tune requested ({bounded(token, 64)})", wall)
            self.retune_token = retune_key(token)
        self.started = True

    # ------------------------------------------------------------------ a user kernel's source

    def wants_source(self, mono: float) -> bool:
        assert self.spec is not None
        return self.spec.kernel.user is not None and self.source.due(mono)

    def source_changed(self) -> None:
        self.source.changed()

    def accept_source(self, data: Mapping[str, str] | None, mono: float, wall: float) -> None:
        """The source's ConfigMap data as just read (None: no such ConfigMap). An edited
        source is another kernel: every pool starts a new round."""
        assert self.spec is not None
        try:
            edited = self.source.read(self.spec, data, mono)
        except KernelSpecError as exc:
            self.spec_error = str(exc)
            return
        if edited:
            for pool in self.pools.values():
                if self.source.failed is None:
                    self._new_round(pool, "the kernel source changed", wall)
                else:  # the fix of a source that did not compile: this round never started
                    pool.move(PoolPhase.PENDING)
                    pool.study = None
            self.source.failed = None
        if self.source.failed is None:  # else the compiler's message stays until the source changes
            self.spec_error = None

    def wants_warm_start(self, mono: float) -> bool:
        return self.spec is not None and self.warm.due(self.spec.warm_start, mono)

    def accept_warm_start(self, data: Sequence[Mapping[str, str] | None], mono: float) -> None:
        """The data of each `spec.warmStart` ConfigMap as just read (None: no such ConfigMap)."""
        assert self.spec is not None and self.spec.warm_start
        self.warm.read(self.spec.warm_start, data, mono)

    @property
    def kernel(self) -> str | None:
        """The kernel's identity across runs (`controller.memory`); None until its source is read."""
        return kernel_id(self.spec, self.source.digest) if self.spec is not None else None

    def wants_memory(self, mono: float) -> str | None:
        """The kernel whose earlier results to read now (`accept_memory`), if any."""
        if self.spec is None or not self.spec.fleet_memory.enabled or (kernel := self.kernel) is None:
            return None
        building = any(p.study is None and not p.done for p in self.pools.values())
        return kernel if self.memory.due(kernel, mono, building) else None

    def accept_memory(self, kernel: str, runs: Sequence[StoredRun], problems: Sequence[str], mono: float) -> None:
        """The earlier runs' stores as just read, and what could not be read (said once, as a warning)."""
        for problem in self.memory.accept(kernel, runs, problems, mono):
            self.events.append(("Warning", "FleetMemory", f"{problem}: pools start without those results"))

    def blocked(self) -> Report | None:
        """The report of a run that cannot tune now (invalid spec, missing or failed source)."""
        if self.spec is None:
            return Report("Failed", [], self.spec_reason, self.spec_error or "invalid spec", finished=True)
        if (waiting := self.warm.waiting(self.spec.warm_start)) is not None:
            reason, message = waiting  # read again, like a kernel source, until it is right
            return Report("Pending" if reason == "SourceNotFound" else "Failed", [], reason, message)
        if self.spec.kernel.user is None:
            return None
        if self.source.text is None:
            if self.source.digest is not None:
                return None  # it tuned a source before: `plan` keeps what was measured in the status
            # The ConfigMap may be applied after the run (GitOps order): wait for it.
            return Report("Pending", [], "SourceNotFound", self.source.waiting(self.spec, self.spec_error))
        if self.source.broken:
            # It did not compile: wait (polling) for the user to fix it.
            return Report("Failed", [], "InvalidSpec", self.spec_error or "invalid kernel source")
        return None

    def results_lost(self, lost: Sequence[TrialRecord]) -> None:
        """Records whose results ConfigMap was deleted: the studies are rebuilt from the
        records that remain (what the status counts and the budget spends), and no new
        trial takes the index of a lost one (its Job may still be being deleted)."""
        for pool in self.pools.values():
            mine = [r.index for r in lost if r.target == pool.key]
            if mine:
                pool.index_floor = max(pool.index_floor, max(mine) + 1)
                if pool.phase != PoolPhase.FAILED:
                    pool.study = None

    # ------------------------------------------------------------------ nodes

    def wants_nodes(self, epoch: int, mono: float) -> bool:
        return self.fleet.wants(epoch, mono)

    def accept_nodes(self, nodes: Sequence[NodeBody], epoch: int, mono: float) -> None:
        self.fleet.accept(nodes, epoch, mono)

    def _track_fleet(self, pool: Pool, obs: Observed) -> bool:
        """Update the pool's view of its nodes; False when it has none to run on."""
        assert self.spec is not None
        nodes, pool.current = self.fleet.of(pool.spec)
        if nodes is not None and pool.current is None:
            if pool.done:
                return False
            selector = f"spec.targets[{pool.spec.name}].nodeSelector {bounded(pool.spec.node_selector, 300)}"
            if not nodes and waits_for_nodes(pool, selector, obs.wall, self.node_wait_s):
                return True
            why = "no node matches" if not nodes else "no eligible node (upgrading, cordoned or shared) among"
            queued = f"; {back_in_queue(len(pool.requeue))}" if pool.requeue else ""
            pool.move(PoolPhase.UNSCHEDULABLE, f"{why} {selector}{queued}")
            return False
        if pool.nodes_missing_since is not None:
            pool.nodes_missing_since = None
            if pool.phase == PoolPhase.RUNNING:
                pool.message = ""
        if pool.phase == PoolPhase.UNSCHEDULABLE:
            pool.move(PoolPhase.RUNNING)
        current = pool.current.fingerprint if pool.current else None
        if pool.tuned_for is None and current is not None:
            pool.tuned_for = current
        if pool.current is not None and not pool.current.mixed and is_stale(pool.tuned_for, current):
            change = describe_change(pool.tuned_for, current)
            if self.spec.retune_policy == "OnDriverChange":
                self._new_round(pool, f"GPU fingerprint changed: {change}", obs.wall)
            elif pool.stale != change:
                pool.stale = change
                self.log.warning("%s is stale: %s (retunePolicy Manual)", pool.key, change)
        return True

    # ------------------------------------------------------------------ one step

    def plan(self, obs: Observed) -> Plan:
        """Decide one step (in a worker thread: it builds searches and fits models)."""
        plan = Plan()
        blocked = self.blocked()
        if blocked is not None:
            plan.report = blocked
            return plan
        assert self.spec is not None
        # A source gone mid-run (its ConfigMap deleted): no new trial starts, but the running
        # ones are recorded and the status keeps every pool's results while the run waits.
        waiting = self.spec.kernel.user is not None and self.source.text is None
        self.capacity_notes = {}
        failed = self._set_up_pools(obs) if not waiting else None
        if failed is not None:
            plan.report = failed
            return plan
        rounds = {key: pool.round for key, pool in self.pools.items()}
        running = collect(obs, plan, rounds)
        if (kernel := self.kernel) is not None:
            plan.records, plan.early = stamped(plan.records, kernel, rounds), stamped(plan.early, kernel, rounds)
        for key, entries in plan.requeue.items():
            self.pools[key].hand_back(entries)
        for job, key, answered, back in plan.preempted:
            self.events.append(("Normal", "Preempted", f"{key}: trial Job {job} was preempted by its queue after "
                                f"{answered} configuration(s); {back} go back to the pool, none counted as failed"))
        for job, key, late, answered, back in plan.stalled:
            note = (f"{key}: trial Job {job} still runs {late:.0f} s after its deadline: the Job controller lost "
                    f"track of it; deleted, {answered} answer(s) kept, {back} configuration(s) go back to the pool")
            self.events.append(("Warning", "TrialJobStalled", note))
            self.log.warning("%s", note)
        for job, key, back in plan.superseded:
            self.log.info("%s: trial Job %s of an earlier operator version deleted, %d configuration(s) go back "
                          "to the pool", key, job, back)
        if plan.early:  # an answer already recorded is not early (a crash between two writes)
            fresh = {(r.round, r.target, r.index) for r in plan.records}
            plan.early = [r for r in plan.early
                          if (where := (r.round, r.target, r.index)) not in obs.stored and where not in fresh]
        # What running Pods answered already counts for everything but the budget: the
        # studies learn from it and the status shows it now, a Pod's length sooner.
        records = Records([*obs.records, *plan.records, *plan.early])
        early = {(r.target, r.index) for r in plan.early}
        self._feed_studies(records)
        run = StepContext(name=self.name, namespace=self.namespace, uid=self.uid, spec=self.spec,
                          source_digest=self.source.digest, policy=self.policy, node_wait_s=self.node_wait_s,
                          fleet=self.fleet, log=self.log, events=self.events, capacity_notes=self.capacity_notes,
                          predictions=self.reporter.gpu_predictions)
        shares = pod_shares(run, list(self.pools.values()), running)
        for pool in self.pools.values():
            if pool.study is not None and not pool.done and not waiting:
                advance(run, pool, running.setdefault(pool.key, []), records, early, obs.wall, plan, shares[pool.key])
        queues = {key: pool_queue(self.spec, pool, self.policy) for key, pool in self.pools.items()}
        report = self.reporter.report(self.spec, self.pools, running, records, obs.mono, obs.wall, queues)
        if self.capacity_notes:
            report = replace(report, targets=[
                t.model_copy(update={"message": "; ".join(filter(None, (t.message, capped)))})
                if (capped := self.capacity_notes.get(t.name)) else t for t in report.targets])
        if waiting and not report.finished:
            report = replace(report, phase="Pending", reason="SourceNotFound",
                             message=self.source.waiting(self.spec, self.spec_error, kept=sum(
                                 r.is_observation for r in [*obs.records, *plan.records])))
        plan.report = report
        drop_finished_studies(self.pools.values())
        return plan

    def _set_up_pools(self, obs: Observed) -> Report | None:
        assert self.spec is not None
        for pool in self.pools.values():
            if not self._track_fleet(pool, obs) or pool.phase == PoolPhase.FAILED:
                continue
            if pool.done and pool.space is not None:
                continue  # its study went when it finished (see `plan`); the space serves predictions
            if pool.study is None:
                try:
                    self._setup_pool(pool, obs)
                except SpecError as exc:
                    self.spec_error = str(exc)
                    # A kernel source that failed to compile: keep polling for its fix.
                    return Report("Failed", [], "InvalidSpec", str(exc), finished=self.source.failed is None)
                except Exception as exc:  # never retry a broken pool forever: fail it, say why
                    self.log.exception("%s: cannot build its search", pool.key)
                    pool.move(PoolPhase.FAILED, f"cannot build the search space: {exc}"[:500])
        return None

    def _setup_pool(self, pool: Pool, obs: Observed) -> None:
        """Search space for the pool's device and a Study warm-started from older rounds."""
        assert self.spec is not None
        check_options(self.spec)
        where = f"spec.targets[{[t.name for t in self.spec.targets].index(pool.spec.name)}]"
        build_search(self.spec, pool, product_of(pool, self.fleet.of(pool.spec)[0]), where)
        if self.source.text is not None:
            problem = compile_check(self.spec, self.source.text, compute_capability(pool), pool.problem_size)
            if problem is not None:
                self.source.failed = self.source.digest
                raise SpecError(f"{problem} (target {pool.key})")
        fleet = self._make_study(pool, obs.records)
        if (given := self.warm.for_target(pool.spec.name)) and pool.study is not None:
            self.events.append(("Normal", "WarmStart", f"{pool.key}: {pool.study.n_prior} earlier results in its "
                                f"space, of them up to {sum(map(len, given))} from spec.warmStart"))
        if fleet.sources:
            self.events.append(("Normal", "WarmStart", fleet.summary(pool.key)))
        if pool.round_started is None:
            pool.round_started = obs.wall
        if pool.phase in (PoolPhase.PENDING, PoolPhase.UNSCHEDULABLE):
            pool.move(PoolPhase.RUNNING, pool.message if pool.nodes_missing_since is not None else "")

    def _make_study(self, pool: Pool, records: Sequence[TrialRecord]) -> FleetPrior:
        """The pool's study, its prior from its older rounds, spec.warmStart, its target's
        other sizes and the fleet (`controller.memory`)."""
        assert self.spec is not None
        fleet = self.memory.prior(pool, self.pools.values(), records, self.namespace, self.spec.fleet_memory.enabled)
        make_study(self.spec, pool, records, self.warm.for_target(pool.spec.name), fleet.observations, fleet.first)
        pool.learned_from, pool.peer_records = fleet.sources, fleet.peer_records
        return fleet

    def _feed_studies(self, records: Sequence[TrialRecord]) -> None:
        if self.spec is not None:
            for pool in outgrown(list(self.pools.values()), records, self.spec.fleet_memory.enabled):
                self._make_study(pool, records)  # the other pools measured more: its own records are fed again
        for pool in self.pools.values():
            if pool.study is None:
                continue
            new = [r for r in pool.records(records) if r.index not in pool.observed and r.is_observation]
            for rec in sorted(new, key=lambda r: r.index):
                pool.observed.add(rec.index)
                pool.study.observe(rec.config, rec.outcome, rec.objective, rec.times)
