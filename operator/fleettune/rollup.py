"""The bounded TuningRun status rolled up from the records (pure; its model is
`fleettune.api.status`, writing it is `fleettune.controller.reporting`'s).

Whatever the number of trials, the status holds counters, the best and top-k
configurations per pool, the fingerprint measured on, and conditions with
`observedGeneration` that kstatus/Flux/Argo CD understand: `Ready` (True once
Succeeded, unless the run publishes and its ConfigMap could not be written), and
kstatus's abnormal-true pair, `Reconciling` (True while Pending or Running: kstatus says
InProgress) and `Stalled` (True once Failed, or finished with its publication refused:
kstatus says Failed); with neither True and `observedGeneration` current, kstatus says Current.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, cast, get_args

from fleettune.api import (
    Condition,
    ConfigResult,
    Fingerprint,
    Phase,
    RankedConfig,
    ResultsRef,
    TargetPhase,
    TargetStatus,
    TrialCounts,
    TunedFor,
    TuningRunStatus,
)
from fleettune.names import INT64_MAX, bounded
from fleettune.results import TrialRecord
from fleettune_job.protocol import Outcome

TOP_K = 5
# etcd keeps an object of at most 1.5 MiB (--max-request-bytes); the spec shares it.
OBJECT_MAX_BYTES = 1_500_000
STATUS_MAX_BYTES = 256 * 1024
STATUS_MIN_BYTES = 8 * 1024
PUBLISH_REFUSED = "PublishRefused"  # the Published condition's reason when the ConfigMap is not the run's
PUBLISH_FAILED = "PublishFailed"  # ... when writing it failed (retried)
CONFIG_VALUE_MAX = 256  # characters of a string parameter value shown in a shrunken status
# Said after a pool's best wherever it is reported when its outputs were never checked.
UNVERIFIED_NOTE = "[unverified: outputs not checked]"


def _target_phase(phase: str) -> TargetPhase:
    """A pool's phase as the status schema spells it (the controller's phases are strings)."""
    if phase not in get_args(TargetPhase):
        raise ValueError(f"not a pool phase: {phase!r}")
    return cast(TargetPhase, phase)


def _run_phase(phase: str) -> Phase:
    if phase not in get_args(Phase):
        raise ValueError(f"not a run phase: {phase!r}")
    return cast(Phase, phase)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def counts(records: Sequence[TrialRecord], running: int, queued: int = 0, pending: int = 0) -> TrialCounts:
    valid = sum(r.outcome == Outcome.OK for r in records)
    infra = sum(r.outcome == Outcome.INFRA_ERROR for r in records)
    return TrialCounts(
        completed=len(records) - infra,
        valid=valid,
        invalid=len(records) - valid - infra,
        infra_failed=infra,
        running=running,
        queued=queued,
        pending=pending,
    )


def ranked(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Valid results, best first, one per configuration (ties broken by trial index for determinism)."""
    seen: set[str] = set()
    out = []
    for rec in sorted((r for r in records if r.outcome == Outcome.OK), key=lambda r: (r.objective, r.index)):
        if rec.key not in seen:
            seen.add(rec.key)
            out.append(rec)
    return out


def outputs_unverified(records: Sequence[TrialRecord]) -> bool:
    """Whether the best result's outputs went unchecked (the fleet simulator cannot compute
    them): then nothing says the fastest configuration is a correct one. Without a valid
    result, what the latest trial reported. A provisional record (an answer read from a
    running Pod's log) carries no fingerprint of its own: the Pods that ended say it."""
    best = ranked(records)
    fp = best[0].fingerprint if best else None
    if fp is None or not fp.product:
        fp = next((r.fingerprint for r in reversed(records) if r.fingerprint is not None and r.fingerprint.product),
                  fp)
    return fp is not None and fp.unverified


def is_unverified(target: TargetStatus) -> bool:
    """Whether a pool's status reports a best whose outputs were not checked."""
    return target.best is not None and target.fingerprint is not None and target.fingerprint.unverified


def said(target: TargetStatus) -> str:
    """A pool's message for events and conditions, with `UNVERIFIED_NOTE` after an unchecked best."""
    if not is_unverified(target):
        return target.message
    assert target.best is not None
    best = f"best {target.best.objective_ms:.4g} ms {UNVERIFIED_NOTE}"
    return f"{target.message}; {best}" if target.message else best


def target_status(
    *,
    name: str,
    phase: str,
    budget: int,
    records: Sequence[TrialRecord],
    running: int,
    device: str = "",
    space_size: int | None = None,
    default_key: str | None = None,
    message: str = "",
    tuning_round: int = 1,
    tuned_for: TunedFor | Mapping[str, Any] | None = None,
    stale: str | None = None,
    top_k: int = TOP_K,
    pods_running: int | None = None,
    trials_per_pod: int | None = None,
    queued: int = 0,
    pods_queued: int = 0,
    queued_since: str | None = None,
    pending: int = 0,
    pods_pending: int = 0,
) -> TargetStatus:
    """`running`: trials being measured; `pods_running`: the Pods measuring them (default:
    one trial per Pod); `queued`, `pods_queued`: the trials and Jobs waiting for their queue,
    the longest since `queued_since`; `pending`, `pods_pending`: those created (and admitted)
    whose Pods have not started (no node or GPU free yet)."""
    best = ranked(records)
    top = [
        ConfigResult(config=r.config, objective_ms=round(r.objective or 0.0, 6), trial=r.index)
        for r in best[: max(top_k, 1)]
    ]
    ranked_top = [
        RankedConfig(config=bounded(" ".join(f"{k}={v}" for k, v in t.config.items()), 512),
                     objective_ms=t.objective_ms, trial=t.trial)
        for t in top
    ]
    default = next((r for r in best if default_key is not None and r.key == default_key), None)
    fp_source = next((r.fingerprint for r in reversed(records) if r.fingerprint is not None), None)
    fingerprint = (
        Fingerprint(**{k: v for k, v in fp_source.model_dump().items() if k in Fingerprint.model_fields}
                    | {"unverified": outputs_unverified(records)})
        if fp_source
        else None
    )
    speedup = None
    if default is not None and best:
        speedup = round((default.objective or 0) / (best[0].objective or 1), 3)
    return TargetStatus(
        name=name,
        phase=_target_phase(phase),
        budget=budget,
        # An integer in the CRD is an int64: a larger space is reported as the largest one.
        space_size=min(space_size, INT64_MAX) if space_size is not None else None,
        device=bounded(device, 256),
        fingerprint=fingerprint,
        best=top[0] if top else None,
        top=ranked_top if top_k > 1 else [],  # `best` alone says it
        default_ms=round(default.objective, 6) if default and default.objective else None,
        speedup=speedup,
        message=bounded(message),
        round=tuning_round,
        tuned_for=TunedFor.model_validate(tuned_for) if tuned_for is not None else None,
        stale=bounded(stale) if stale is not None else None,
        pods_running=running if pods_running is None else pods_running,
        trials_per_pod=trials_per_pod,
        pods_queued=pods_queued,
        pods_pending=pods_pending,
        queued_since=queued_since,
        **counts(records, running, queued, pending).model_dump(),
    )


def _summary(targets: Sequence[TargetStatus]) -> str:
    parts = [f"{t.name}={t.best.objective_ms:.3g}ms" for t in targets if t.best is not None]
    # The mark first: a long summary is cut at its end.
    mark = ["(unverified)"] if any(is_unverified(t) for t in targets) else []
    return bounded(" ".join(mark + parts), 200)


def set_condition(
    conditions: list[Condition], kind: str, status: bool, reason: str, message: str, generation: int | None
) -> list[Condition]:
    """Replace one condition, keeping its transition time if its status did not change."""
    value: Literal["True", "False"] = "True" if status else "False"
    old = next((c for c in conditions if c.type == kind), None)
    when = old.last_transition_time if old is not None and old.status == value else now()
    new = Condition(
        type=kind, status=value, reason=bounded(reason, 128), message=bounded(message),
        last_transition_time=when, observed_generation=generation,
    )
    return [c for c in conditions if c.type != kind] + [new]


def run_status(
    *,
    previous: TuningRunStatus | None,
    generation: int | None,
    phase: str,
    targets: Sequence[TargetStatus],
    results: dict[str, Any] | None,
    reason: str,
    message: str,
    extra: dict[str, Any] | None = None,
    published: tuple[bool, str, str] | None = None,
    queue: tuple[bool, str, str] | None = None,
) -> TuningRunStatus:
    """`extra`: further top-level status fields (snake_case names of TuningRunStatus).
    `published`: (status, reason, message) of the `Published` condition when the run
    publishes (None: no such condition); a refused publication (reason PUBLISH_REFUSED)
    also degrades the run. `queue`: the same for `QueueDelayed` when trials go through a
    Kueue queue (True: a pool's Jobs waited longer than its queue's maxWaitSeconds)."""
    prev = previous or TuningRunStatus()
    total = TrialCounts(
        **{f: sum(getattr(t, f) for t in targets) for f in TrialCounts.model_fields}
    )
    budget = sum(t.budget for t in targets)
    conditions = list(prev.conditions)
    terminal = phase in ("Succeeded", "Failed")
    degraded = phase == "Failed" or any(t.phase in ("Failed", "Unschedulable") for t in targets)
    refused = published is not None and published[1] == PUBLISH_REFUSED
    # The ConfigMap is the run's declared output, what applications mount: a run that tuned
    # but could not write it is not Ready (`kubectl wait --for=condition=Ready` must not pass).
    undelivered = (phase == "Succeeded" and published is not None and not published[0]
                   and published[1] in (PUBLISH_REFUSED, PUBLISH_FAILED))
    if undelivered:
        assert published is not None
        conditions = set_condition(conditions, "Ready", False, published[1], published[2], generation)
    else:
        conditions = set_condition(conditions, "Ready", phase == "Succeeded", reason, message, generation)
    # kstatus (Flux, kpt, cli-utils) reads these two: InProgress while Reconciling, Failed when Stalled.
    conditions = set_condition(
        conditions, "Reconciling", not terminal, reason if not terminal else "Finished", message, generation
    )
    failed = phase == "Failed"
    if terminal and refused:
        # Only a person can free the name (or choose another): kstatus (Flux's `wait`) says Failed, not Current.
        assert published is not None
        conditions = set_condition(conditions, "Stalled", True, published[1], published[2], generation)
    else:
        conditions = set_condition(
            conditions, "Stalled", failed, reason if failed else "AsExpected", message if failed else "", generation
        )
    conditions = set_condition(
        conditions, "Progressing", not terminal, reason if not terminal else "Finished", message, generation
    )
    if not degraded and refused:
        assert published is not None
        degraded, reason_d, message_d = True, published[1], published[2]
    else:
        reason_d, message_d = (reason, message) if degraded else ("AsExpected", "")
    conditions = set_condition(conditions, "Degraded", degraded, reason_d, message_d, generation)
    if published is None:
        conditions = [c for c in conditions if c.type != "Published"]
    else:
        conditions = set_condition(conditions, "Published", *published, generation)
    if queue is None:
        conditions = [c for c in conditions if c.type != "QueueDelayed"]
    else:
        conditions = set_condition(conditions, "QueueDelayed", *queue, generation)
    stale = [f"{t.name}: {t.stale}" for t in targets if t.stale]
    conditions = set_condition(
        conditions, "Stale", bool(stale), "FingerprintChanged" if stale else "UpToDate", "; ".join(stale), generation
    )
    return TuningRunStatus(
        phase=_run_phase(phase),
        observed_generation=generation,
        progress=f"{total.completed}/{budget}",
        best_summary=_summary(targets),
        trials=total,
        targets=list(targets),
        results=ResultsRef.model_validate(results) if results is not None else None,
        conditions=conditions,
        started_at=prev.started_at or now(),
        completed_at=(prev.completed_at or now()) if terminal else None,
        **(extra or {}),
    )


def _json_size(doc: Any) -> int:
    return len(json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())


def status_budget(body: dict[str, Any]) -> int:
    """How many bytes the status of ``body`` (a TuningRun as read) may take: what etcd's
    object limit leaves beside the spec and metadata, at most STATUS_MAX_BYTES."""
    rest = _json_size({k: v for k, v in body.items() if k != "status"})
    return max(STATUS_MIN_BYTES, min(STATUS_MAX_BYTES, OBJECT_MAX_BYTES - rest - 16 * 1024))


def _bound_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: bounded(v, CONFIG_VALUE_MAX) if isinstance(v, str) else v for k, v in config.items()}


def fit_status(status: dict[str, Any], budget: int) -> dict[str, Any]:
    """``status`` (the JSON form) shrunk until it fits ``budget`` bytes, least useful first:
    the top-k lists, long string values of configurations, predictions, then everything
    per target but its counters and phase. A status that cannot be written shows nothing
    at all, so a smaller one is always better; the full results are in the results store."""
    if _json_size(status) <= budget:
        return status
    out = json.loads(json.dumps(status))
    targets = out.get("targets") or []

    def shrink_configs() -> None:
        for t in targets:
            if t.get("best"):
                t["best"]["config"] = _bound_config(t["best"]["config"])
        for p in out.get("predictions") or []:
            if p.get("config"):
                p["config"] = _bound_config(p["config"])

    def strip_targets() -> None:
        keep = {"name", "target", "problemSize", "phase", "budget", "round", "completed", "valid", "invalid",
                "infraFailed", "running", "queued", "pending"}
        for i, t in enumerate(targets):
            targets[i] = {k: v for k, v in t.items() if k in keep} | {"message": bounded(t.get("message", ""), 200)}

    steps = [
        lambda: [t.pop("top", None) for t in targets],
        shrink_configs,
        lambda: out.pop("predictions", None),
        strip_targets,
        lambda: out.update(targets=[], bestSummary=""),
    ]
    for step in steps:
        step()
        if _json_size(out) <= budget:
            break
    return out
