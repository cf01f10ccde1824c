"""A pool's next trials in one step (pure): what its budget has spent and has left, what
its stopping rule says (`fleettune.optimize.stopping`), how many new Pods it starts, of how
many trials each (`controller.batches`), which configurations they measure, and their
Jobs rendered (`fleettune.jobs.render_job`).

The planner (`fleettune.controller.planner`) calls `advance` for each pool with a study,
once the step's finished Jobs are collected (`controller.plan.collect`), with what the
pool's new Jobs need of the run (`StepContext`). `advance` moves the pool (its phase, its
re-queued configurations) and fills the plan: Jobs to create, Jobs to delete, records of
the trials it stops. A Job it renders joins the pool's running Jobs, parsed like those the
shell read (`controller.observed.parse_job`).

With ``budget.stopWhenPredicted``, a pool's first Pods also measure the fleet's confident
prediction for it (`confident_prediction`), and the pool stops once that configuration
held up (`confirmation`, `optimize.stopping.prediction_confirmed`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleettune.admission import TrialPolicy
from fleettune.api import QueueSpec, TuningRunSpec
from fleettune.controller.batches import batch_sizes, free_slots, pods_at_once, share_pods
from fleettune.controller.fleet import FleetView
from fleettune.controller.lifecycle import PoolPhase
from fleettune.controller.observed import ObservedJob, parse_job
from fleettune.controller.plan import Plan, Suggested
from fleettune.controller.pool import Pool
from fleettune.controller.reporting import Event
from fleettune.fingerprint import eligibility_affinity, pinning_selector
from fleettune.jobs import queue_of, render_job
from fleettune.labels import ROUND_LABEL
from fleettune.names import bounded
from fleettune.optimize.stopping import (
    DEFAULT_MIN_GAIN,
    Budget,
    Progress,
    Verdict,
    confident,
    confirmed_message,
    pool_verdict,
    prediction_confirmed,
)
from fleettune.results import TrialRecord
from fleettune_job.protocol import Outcome


def back_in_queue(n: int) -> str:
    return f"{n} configuration(s) back in the queue, none counted as failed"


def pool_queue(spec: TuningRunSpec, pool: Pool, policy: TrialPolicy | None) -> QueueSpec | None:
    """The Kueue queue of the pool's trial Jobs (`jobs.queue_of`; ``policy`` None: the
    operator's, from its environment)."""
    return queue_of(spec, pool.spec, policy or TrialPolicy.from_env())


@dataclass(frozen=True)
class StepContext:
    """What a pool's new trial Jobs need of their run in one step, and where `advance`
    notes what it did beyond the plan."""

    name: str  # the run's name, namespace and uid: its Jobs' owner
    namespace: str
    uid: str
    spec: TuningRunSpec
    source_digest: str | None  # the user kernel source checked (`controller.source`)
    policy: TrialPolicy | None  # the operator's trial policy (None: from its environment)
    node_wait_s: float  # how long a pool with no node waits for an autoscaler
    fleet: FleetView
    log: logging.Logger | logging.LoggerAdapter[Any]
    events: list[Event] = field(default_factory=list)  # the planner's events, appended to
    capacity_notes: dict[str, str] = field(default_factory=dict)  # pool key -> why it runs fewer Pods
    # The run's predictions from the other GPUs (status.predictions, `source: gpus`).
    predictions: Sequence[Mapping[str, Any]] = ()

    def queue(self, pool: Pool) -> QueueSpec | None:
        return pool_queue(self.spec, pool, self.policy)


def _ends(pool: Pool, running: list[ObservedJob], plan: Plan, verdict: Verdict | None) -> bool:
    """Apply a stopping verdict (`optimize.stopping.pool_verdict`): True when the pool
    starts no new trial. Trials it stops keep what their Pods answered already: those
    records are stored before the Jobs are deleted."""
    if verdict is not None and verdict.phase is not None:
        if verdict.stop_running:
            names = {j.name for j in running}
            plan.records += [r for r in plan.early if r.job in names]
            plan.delete_now += sorted(names)
            running.clear()
        pool.move(PoolPhase(verdict.phase), verdict.message)
    return verdict is not None


def _withdraw(run: StepContext, pool: Pool, running: list[ObservedJob], plan: Plan) -> None:
    """A pool no node matches, its wait for an autoscaler over: its trials would wait
    for a node that is not coming (and keep asking an autoscaler for one), so their
    Jobs are deleted and their configurations go back to the pool, measured first when
    a node comes; none is recorded (a Pod that ended is collected before this)."""
    for job in running:
        plan.delete_now.append(job.name)
        pool.hand_back(job.entries)
    if running:
        names = ", ".join(j.name for j in running)
        note = f"{len(running)} waiting trial Job(s) withdrawn, {back_in_queue(len(pool.requeue))}"
        pool.message = f"{pool.message}; {note}" if pool.message else note
        run.events.append(("Normal", "Withdrawn", f"{pool.key}: no node matches: {bounded(names, 200)}: {note}"))
        run.log.info("%s: %s", pool.key, note)
    running.clear()


def confident_prediction(pool: Pool, predictions: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The pool's prediction from the other GPUs (its target and size), as (key,
    configuration), when it is confident (`optimize.stopping.confident`) and a valid
    candidate of the pool's space: it may have been made before the pool had a device,
    without that device's constraints. None otherwise."""
    from fleettune.space import SpaceError

    assert pool.space is not None
    entry = next((p for p in predictions if p.get("source") == "gpus" and p.get("target") == pool.spec.name
                  and list(p.get("problemSize") or ()) == list(pool.problem_size)), None)
    if entry is None or not confident(entry.get("expectedFractionRange")):
        return None
    config = dict(entry.get("config") or {})
    try:
        if bool(pool.space.is_valid(pool.space.to_rows([config]))[0]):
            return pool.space.key(config), config
    except (SpaceError, KeyError, ValueError, TypeError):
        pass
    return None


def confirmation(pool: Pool, mine: Sequence[TrialRecord]) -> str | None:
    """The pool's message when its predicted configuration held up
    (`optimize.stopping.prediction_confirmed`, against the strategy's ``min_gain``), else None."""
    if pool.predicted is None or pool.study is None:
        return None
    key = pool.predicted[0]
    measured = sorted((r for r in mine if r.is_observation), key=lambda r: r.index)
    own = next((r for r in measured if r.key == key), None)
    if own is None:
        return None

    def time_of(r: TrialRecord) -> float:
        return r.objective if r.outcome == Outcome.OK and r.objective else math.nan

    others = [time_of(r) for r in measured if r is not own]
    gain = float(getattr(pool.study.strategy.options, "min_gain", DEFAULT_MIN_GAIN))
    return confirmed_message(key, gain, len(others)) if prediction_confirmed(time_of(own), others, gain=gain) else None


def pod_shares(run: StepContext, pools: Sequence[Pool], running: Mapping[str, Sequence[ObservedJob]]) -> dict[str, int]:
    """The Pods each tuning pool may run at once (`pods_at_once`, shared among a target's
    problem sizes by `share_pods`); the capacity notes go into ``run``."""
    targets: dict[str, list[Pool]] = {}
    for pool in pools:
        if pool.study is not None and not pool.done:
            targets.setdefault(pool.spec.name, []).append(pool)
    shares: dict[str, int] = {}
    for group in targets.values():
        target = group[0].spec
        at_once, capped = pods_at_once(run.spec.budget.parallelism, run.fleet.capacity(target), target.gpus)
        if capped is not None:
            run.capacity_notes.update({pool.key: capped for pool in group})
        shares |= share_pods(at_once, [(p.key, len(running.get(p.key, ())), len(p.observed)) for p in group])
    return shares


def advance(run: StepContext, pool: Pool, running: list[ObservedJob], records: Sequence[TrialRecord],
            early: Container[tuple[str, int]], wall: float, plan: Plan, at_once: int) -> None:
    """Into `plan` and `pool`: the pool's next step (`running`: its running Jobs, which the
    Jobs it creates join; ``at_once``: the Pods it may run, `pod_shares`). `early`: the
    (pool, index) of `records` that running Pods answered in their logs; until stored, they
    stay in flight for the budget."""
    assert pool.study is not None and pool.space is not None
    budget = run.spec.budget
    mine = pool.records(records)
    observations = sum(r.is_observation and (r.target, r.index) not in early for r in mine)
    infra = [r for r in mine if not r.is_observation]
    in_flight = [entry for job in running for entry in job.entries]
    rules = Budget(budget.trials_per_target, budget.max_infra_failures, budget.deadline_seconds)
    progress = Progress(
        # A batch Pod that died is one failure of the infrastructure, however many trials it held.
        observations=observations, infra_failures=len({r.job or r.index for r in infra}), infra_trials=len(infra),
        elapsed_s=wall - (pool.round_started or wall), running=len(running),
        last_infra_error=next((r.error for r in reversed(infra) if r.error), ""),
        study_reason=pool.study.should_stop(patience=budget.patience) if budget.patience is not None else None,
        confirmed=confirmation(pool, mine) if budget.stop_when_predicted else None,
    )
    if _ends(pool, running, plan, pool_verdict(rules, progress)):
        return
    if pool.phase == PoolPhase.UNSCHEDULABLE:
        nodes, _ = run.fleet.of(pool.spec)
        if nodes is not None and not nodes:
            _withdraw(run, pool, running, plan)
        return
    slots = free_slots(at_once, running, pool.nodes_missing_since is not None, run.queue(pool) is not None)
    left = budget.trials_per_target - observations - len(in_flight)
    if slots <= 0 or left <= 0:
        return
    pending = [config for i, config in in_flight if (pool.key, i) not in early]
    keys = {r.key for r in mine if r.is_observation} | {pool.space.key(c) for c in pending}
    default_first = pool.default_config is not None and pool.default_key not in keys
    aim, sizes = batch_sizes(budget, pool.study.learns, mine, slots, left, default_first, observations,
                             len(in_flight), at_once)
    configs: list[dict[str, Any]] = [pool.default_config] if default_first and pool.default_config else []
    taken = keys | ({pool.default_key} if default_first else set())
    if budget.stop_when_predicted and pool.predicted is None and not mine and not in_flight:
        # The round's first Pods: the fleet's prediction is measured beside the default.
        pool.predicted = confident_prediction(pool, run.predictions)
        if pool.predicted is not None and (key := pool.predicted[0]) not in taken:
            if sum(sizes) > len(configs):
                configs.append(pool.predicted[1])
                taken = taken | {key}
            else:  # a Pod of one holds the default: the prediction goes first in the next
                pool.requeue.insert(0, pool.predicted[1])
            note = f"{pool.key}: measuring the other GPUs' confident prediction {key} first (budget.stopWhenPredicted)"
            run.events.append(("Normal", "PredictionMeasured", note))
            run.log.info("%s", note)
    # What preempted Jobs did not measure goes first: it was chosen already, and is still unmeasured.
    requeued = list({k: c for c in pool.requeue if (k := pool.space.key(c)) not in taken}.values())
    take = max(0, sum(sizes) - len(configs))
    configs += requeued[:take]
    pool.requeue = requeued[take:]
    if sum(sizes) > len(configs):
        started = time.perf_counter()
        try:
            suggested = pool.study.suggest(sum(sizes) - len(configs), pending + configs)
        except Exception as exc:  # a strategy that cannot suggest would fail the same way forever
            run.log.exception("%s: the strategy failed", pool.key)
            message = f"spec.strategy: the strategy failed: {exc}"[:500]
            _ends(pool, running, plan, Verdict("Failed", message, stop_running=True))
            return
        plan.suggested.append(Suggested(pool.key, time.perf_counter() - started, pool.study.last_fit_seconds))
        configs += suggested
        if not pool.prior_dropped and (after := pool.study.prior_dropped_after) is not None:
            pool.prior_dropped = True
            note = (f"earlier results dropped after {after} "
                    "trials without improvement: tuning from this round's own")
            pool.message = f"{pool.message}; {note}" if pool.message else note
            run.log.info("%s: %s", pool.key, note)
    if not configs:
        _ends(pool, running, plan, pool_verdict(rules, replace(progress, exhausted=True)))
        return
    used = [r.index for r in pool.records(records, all_rounds=True)] + [i for i, _ in in_flight]
    index = max(max(used, default=-1) + 1, pool.index_floor)
    pin = pinning_selector(pool.tuned_for) if pool.tuned_for is not None else {}
    avoid = eligibility_affinity(pool.spec.allow_shared_gpus)
    best_ms = min((r.objective for r in mine if r.outcome == Outcome.OK and r.objective), default=None)
    for size in sizes:
        group, configs = configs[:size], configs[size:]
        if not group:
            break
        keyed = [(c, pool.space.key(c)) for c in group]
        body = render_job(
            run=run.name, namespace=run.namespace, uid=run.uid, spec=run.spec, target=pool.spec,
            index=index, configs=keyed, pin=pin, node_expressions=avoid,
            key=pool.key, problem_size=pool.problem_size, source_digest=run.source_digest, policy=run.policy,
            best_ms=None if any(k == pool.default_key for _, k in keyed) else best_ms,
        )
        index += len(group)
        for labels in (body["metadata"]["labels"], body["spec"]["template"]["metadata"]["labels"]):
            labels[ROUND_LABEL] = str(pool.round)
        if pool.nodes_missing_since is not None:  # its wait for a node must not time the trial out
            body["spec"]["activeDeadlineSeconds"] += int(run.node_wait_s)
        plan.create.append(body)
        running.append(parse_job(body))  # the status counts it from this step on
    pool.trials_per_pod = aim
