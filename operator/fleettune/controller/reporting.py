"""What a run says about itself: its report, status, events and predictions (pure).

The planner decides the pools' phases; this turns them into the run's phase, the status
written to the API server (bounded to fit beside the spec in etcd), the Kubernetes Events
that announce each transition once, and the recommendations: for `spec.predictFor`, and for
the pools with no valid result yet from the other targets (`fleettune.fleetprediction`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleettune.api import PriorSource, QueueSpec, TargetStatus, TuningRunSpec, TuningRunStatus
from fleettune.controller.lifecycle import PoolPhase
from fleettune.controller.memory import MAX_NAMED
from fleettune.controller.observed import ObservedJob
from fleettune.controller.pool import Pool, iso_time
from fleettune.metrics import parse_time
from fleettune.results import TrialRecord
from fleettune.rollup import TOP_K, fit_status, run_status, said, status_budget, target_status
from fleettune_job.protocol import Outcome

Event = tuple[str, str, str]  # (type, reason, message)

PREDICT_EVERY_S = 30.0
BASIS_MAX = 400  # characters of a prediction's basis: its factors, then what the model saw


@dataclass(frozen=True)
class Report:
    """The run's phase and its targets' statuses for one step."""

    phase: str
    targets: list[TargetStatus]
    reason: str
    message: str
    finished: bool = False  # nothing left to do for this generation
    queue: tuple[bool, str, str] | None = None  # the QueueDelayed condition, when trials are queued


class Reporter:
    def __init__(self, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.log = log
        # Events to post with the next status write. Phases last announced, per target and
        # for the run ("" key), so a transition is said once.
        self.events: list[Event] = []
        self.announced: dict[str, str] = {}
        self.predictions: list[dict[str, Any]] = []
        self.predicted_for: tuple[Any, float] | None = None
        self.size_predictions: list[dict[str, Any]] = []
        self.gpu_predictions: list[dict[str, Any]] = []
        self.predicted_gpus_for: tuple[Any, Any, float] | None = None
        self.budget: tuple[Any, int] | None = None

    def restore(self, previous: TuningRunStatus) -> None:
        # After a restart, what the status already says was announced before.
        ready = next((c.reason for c in previous.conditions if c.type == "Ready"), "")
        if previous.phase == "Succeeded":
            ready = "Tuned"  # Ready may name an unwritten ConfigMap instead; the run's own reason is this
        self.announced = {t.name: t.phase for t in previous.targets} | {"": f"{previous.phase}/{ready}"}

    def report(self, spec: TuningRunSpec, pools: Mapping[str, Pool], running: Mapping[str, list[ObservedJob]],
               records: Sequence[TrialRecord], mono: float, wall: float | None = None,
               queues: Mapping[str, QueueSpec | None] | None = None) -> Report:
        """`running`: each pool's unfinished Jobs (those its queue holds among them);
        `queues`: each pool's Kueue queue (`jobs.queue_of`), `wall`: now, for their waits. A
        Job that is not suspended and not `started` waits for a node or a GPU: pending."""
        targets = []
        delayed: list[str] = []
        # Many (pool, size) entries share the status: fewer top configurations each.
        top_k = TOP_K if len(pools) <= 8 else 2 if len(pools) <= 16 else 1
        for pool in pools.values():
            jobs = running.get(pool.key, [])
            held = [j for j in jobs if j.suspended]
            since = min(filter(None, (j.suspended_since for j in held)), default=None)
            spec_queue = (queues or {}).get(pool.key)
            began = parse_time(since)
            waited = wall - began if wall is not None and began is not None else None
            if spec_queue is not None and waited is not None and waited > spec_queue.max_wait_seconds:
                delayed.append(f"{pool.key}: {len(held)} trial Job(s) waiting {waited:.0f} s for admission by "
                               f"LocalQueue {spec_queue.name} (more than maxWaitSeconds "
                               f"{spec_queue.max_wait_seconds})")
            mine = pool.records(records)
            # Admitted (or never queued), but not yet running: their Pods wait for a node or a GPU.
            waiting = [j for j in jobs if not j.suspended and not j.started]
            live = {j.name for j in jobs if not j.suspended and j.started}
            status = target_status(
                name=pool.key, phase=pool.phase.value, budget=spec.budget.trials_per_target,
                records=mine,
                # A running Pod's entries less those it has answered already (`Plan.early`).
                running=sum(len(j.entries) for j in jobs if j.name in live)
                - sum(r.job in live for r in mine),
                device=pool.device, space_size=pool.space_size, default_key=pool.default_key,
                message=pool.message, tuning_round=pool.round, stale=pool.stale,
                tuned_for=pool.tuned_for.to_status() if pool.tuned_for else None, top_k=top_k,
                pods_running=len(live), trials_per_pod=pool.trials_per_pod,
                queued=sum(len(j.entries) for j in held), pods_queued=len(held), queued_since=since,
                pending=sum(len(j.entries) for j in waiting), pods_pending=len(waiting),
            )
            update: dict[str, Any] = {"problem_size": list(pool.problem_size)}
            if pool.study is not None:
                pool.prior_weight = pool.study.prior_weight
            if pool.learned_from:
                update["learned_from"] = [PriorSource(kind=kind, name=name, results=n)
                                          for kind, name, n in pool.learned_from[:MAX_NAMED]]
            if pool.prior_weight is not None:
                update["prior_weight"] = round(pool.prior_weight, 3)
            if pool.key != pool.spec.name:
                update["target"] = pool.spec.name
            if pool.round_started:
                update["round_started_at"] = iso_time(pool.round_started)
            targets.append(status.model_copy(update=update))
        for t in targets:
            if self.announced.get(t.name, PoolPhase.PENDING.value) != t.phase:
                self.announced[t.name] = t.phase
                kind = "Warning" if t.phase in (PoolPhase.FAILED.value, PoolPhase.UNSCHEDULABLE.value) else "Normal"
                self.events.append((kind, f"Target{t.phase}", f"{t.name}: {said(t) or t.phase}"))
        self._predict(spec, pools, records, mono)
        queue: tuple[bool, str, str] | None = None
        if any(q is not None for q in (queues or {}).values()):
            queue = (True, "QueueWaitExceeded", "; ".join(delayed)) if delayed else (False, "AsExpected", "")
        if all(p.done for p in pools.values()):
            failed = all(p.phase == PoolPhase.FAILED for p in pools.values())
            phase, reason = ("Failed", "AllTargetsFailed") if failed else ("Succeeded", "Tuned")
            message = "; ".join(f"{t.name}: {said(t)}" for t in targets if said(t))
            return Report(phase, targets, reason, message, finished=True, queue=queue)
        # A pool that waits for an autoscaler's node is named: "0 trials running, 1 pending"
        # alone does not say that nothing will run until a node comes.
        names = {t.name for t in targets}
        no_node = [f"{k}: {p.message}" for k, p in pools.items()
                   if p.nodes_missing_since is not None and not p.done and k in names and p.message]
        stuck = [t.message for t in targets if t.phase == PoolPhase.UNSCHEDULABLE.value] + no_node + delayed
        queued, pending = sum(t.queued for t in targets), sum(t.pending for t in targets)
        message = "; ".join(stuck) or f"{sum(t.running for t in targets)} trials running" + (
            f", {pending} pending" if pending else "") + (f", {queued} queued" if queued else "")
        return Report("Running", targets, "Tuning", message, queue=queue)

    def status(self, report: Report, *, previous: TuningRunStatus | None, body: Mapping[str, Any],
               results: dict[str, Any], published: tuple[bool, str, str] | None,
               published_name: str | None, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The status to write (camelCase), shrunk to fit beside the spec; notes the run's
        own phase change as an event. `extra`: the planner's own status fields."""
        generation = body["metadata"].get("generation")
        extra = {
            **extra,
            "published": published_name if published == (True, "Published", "") else None,
            "predictions": self.predictions,
        }
        status = run_status(
            previous=previous, generation=generation, phase=report.phase, targets=report.targets,
            results=results, reason=report.reason, message=report.message, extra=extra, published=published,
            queue=report.queue,
        ).model_dump(by_alias=True, exclude_none=True, mode="json")
        # Whatever the spec holds, the status must fit beside it in etcd: a status that
        # cannot be written shows nothing, not even why.
        if self.budget is None or self.budget[0] != generation:
            self.budget = (generation, status_budget(dict(body)))
        if self.announced.get("") != f"{report.phase}/{report.reason}":
            self.announced[""] = f"{report.phase}/{report.reason}"
            bad = report.phase == "Failed" or report.reason in ("InvalidSpec", "SourceNotFound")
            self.events.append(("Warning" if bad else "Normal", report.reason, report.message))
        return fit_status(status, self.budget[1])

    def take_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    # ------------------------------------------------------------------ predictions

    def _predict(self, spec: TuningRunSpec, pools: Mapping[str, Pool], records: Sequence[TrialRecord],
                 mono: float) -> None:
        mine = {p.key: p.records(records) for p in pools.values()}
        self._predict_sizes(spec, pools, mine, mono)
        self._predict_gpus(pools, mine, mono)
        self.predictions = self.size_predictions + self.gpu_predictions

    def _predict_sizes(self, spec: TuningRunSpec, pools: Mapping[str, Pool],
                       mine: Mapping[str, Sequence[TrialRecord]], mono: float) -> None:
        """Recommendations for spec.predictFor from the tuned sizes, refreshed when results
        land (at most every PREDICT_EVERY_S while tuning, since each fits a GP)."""
        if not spec.predict_for:
            self.size_predictions = []
            return
        sizes = [tuple(s) for s in spec.predict_for]
        basis = tuple((p.key, p.round, len(mine[p.key])) for p in pools.values())
        done = all(p.done for p in pools.values())
        last = self.predicted_for
        if last is not None and (last[0] == (basis, sizes) or (not done and mono - last[1] < PREDICT_EVERY_S)):
            return
        self.predicted_for = ((basis, sizes), mono)
        self.size_predictions = self._predictions(spec.strategy.seed, pools, sizes, mine)

    def _predict_gpus(self, pools: Mapping[str, Pool], mine: Mapping[str, Sequence[TrialRecord]],
                      mono: float) -> None:
        """Recommendations for the pools with no valid result yet, from the other targets at
        their size: refreshed when results land, at most every PREDICT_EVERY_S while tuning,
        but at once when a pool gets its first valid result (its prediction goes) or the
        pools change."""
        basis = tuple((p.key, p.round, len(mine[p.key])) for p in pools.values())
        measured = tuple((p.key, p.round, any(r.outcome == Outcome.OK for r in mine[p.key])) for p in pools.values())
        done = all(p.done for p in pools.values())
        last = self.predicted_gpus_for
        if last is not None and (last[0] == basis or (
                not done and last[1] == measured and mono - last[2] < PREDICT_EVERY_S)):
            return
        self.predicted_gpus_for = (basis, measured, mono)
        self.gpu_predictions = self._gpu_predictions(pools, mine)

    def _gpu_predictions(self, pools: Mapping[str, Pool],
                         mine: Mapping[str, Sequence[TrialRecord]]) -> list[dict[str, Any]]:
        from fleettune.fleetprediction import recommend
        from fleettune.prediction import observations

        observed = {key: observations(recs) for key, recs in mine.items()}
        out: list[dict[str, Any]] = []
        for pool in pools.values():
            others = {p.spec.name: observed[p.key] for p in pools.values()
                      if p.problem_size == pool.problem_size and p.spec.name != pool.spec.name}
            try:
                rec = recommend(observed[pool.key], others, _fits(pool.space))
            except Exception:  # a prediction must never stop the tuning
                self.log.exception("%s: prediction from the other GPUs failed", pool.key)
                continue
            if rec is not None:
                entry = {"target": pool.spec.name, "problemSize": list(pool.problem_size), **rec.as_dict()}
                out.append(entry | {"basis": entry["basis"][:BASIS_MAX]})
        return out

    def _predictions(self, seed: int, pools_: Mapping[str, Pool], sizes: list[tuple[int, ...]],
                     mine: Mapping[str, Sequence[TrialRecord]]) -> list[dict[str, Any]]:
        from fleettune.prediction import observations, recommend

        out: list[dict[str, Any]] = []
        by_target: dict[str, list[Pool]] = {}
        for pool in pools_.values():
            by_target.setdefault(pool.spec.name, []).append(pool)
        for target, pools in by_target.items():
            space = next((p.space for p in pools if p.space is not None), None)
            observed = {p.problem_size: observations(mine[p.key]) for p in pools}
            for size in sizes:
                entry: dict[str, Any] = {"target": target, "problemSize": list(size)}
                if space is None or not any(v for recs in observed.values() for _, v in recs):
                    entry["basis"] = "no valid result yet"
                else:
                    try:
                        rec = recommend(space, observed, size, seed=seed)
                        entry.update(rec.as_dict())
                        entry["basis"] = entry["basis"][:BASIS_MAX]
                    except ValueError as exc:  # e.g. a size with the wrong number of dimensions
                        entry["basis"] = f"spec.predictFor: {exc}"[:200]
                    except Exception as exc:  # a prediction must never stop the tuning
                        self.log.exception("%s: prediction for %s failed", target, size)
                        entry["basis"] = f"prediction failed: {exc}"[:200]
                out.append(entry)
        return out


def _fits(space: Any) -> Callable[[dict[str, Any]], bool] | None:
    """Whether a configuration is valid on a pool's device (its constraints); None: the
    pool's space is not built yet (no node, so no device known)."""
    if space is None:
        return None
    from fleettune.space import SpaceError

    def fits(config: dict[str, Any]) -> bool:
        try:
            return bool(space.is_valid(space.to_rows([config]))[0])
        except (SpaceError, KeyError, ValueError, TypeError):
            return False

    return fits
