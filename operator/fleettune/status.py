"""Compute the bounded TuningRun status from the records (pure).

Whatever the number of trials, the status holds counters, the best and top-k
configurations per pool, the fingerprint measured on, and conditions with
`observedGeneration` that kstatus/Flux/Argo CD understand.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from fleettune.api import (
    Condition,
    ConfigResult,
    Fingerprint,
    TargetStatus,
    TrialCounts,
    TuningRunStatus,
)
from fleettune.results import TrialRecord
from fleettune_job.protocol import Outcome

TOP_K = 5


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def counts(records: Sequence[TrialRecord], running: int) -> TrialCounts:
    valid = sum(r.outcome == Outcome.OK for r in records)
    infra = sum(r.outcome == Outcome.INFRA_ERROR for r in records)
    return TrialCounts(
        completed=len(records) - infra,
        valid=valid,
        invalid=len(records) - valid - infra,
        infra_failed=infra,
        running=running,
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
    tuned_for: dict[str, Any] | None = None,
    stale: str | None = None,
    top_k: int = TOP_K,
) -> TargetStatus:
    best = ranked(records)
    top = [
        ConfigResult(config=r.config, objective_ms=round(r.objective or 0.0, 6), trial=r.index)
        for r in best[: max(top_k, 1)]
    ]
    default = next((r for r in best if default_key is not None and r.key == default_key), None)
    fp_source = next((r.fingerprint for r in reversed(records) if r.fingerprint is not None), None)
    fingerprint = (
        Fingerprint(**{k: v for k, v in fp_source.model_dump().items() if k in Fingerprint.model_fields})
        if fp_source
        else None
    )
    speedup = None
    if default is not None and best:
        speedup = round((default.objective or 0) / (best[0].objective or 1), 3)
    return TargetStatus(
        name=name,
        phase=phase,  # type: ignore[arg-type]
        budget=budget,
        space_size=space_size,
        device=device,
        fingerprint=fingerprint,
        best=top[0] if top else None,
        top=top if top_k > 1 else [],  # `best` alone says it
        default_ms=round(default.objective, 6) if default and default.objective else None,
        speedup=speedup,
        message=message,
        round=tuning_round,
        tuned_for=tuned_for,
        stale=stale,
        **counts(records, running).model_dump(),
    )


def _summary(targets: Sequence[TargetStatus]) -> str:
    parts = [f"{t.name}={t.best.objective_ms:.3g}ms" for t in targets if t.best is not None]
    return " ".join(parts)[:200]


def set_condition(
    conditions: list[Condition], kind: str, status: bool, reason: str, message: str, generation: int | None
) -> list[Condition]:
    """Replace one condition, keeping its transition time if its status did not change."""
    value = "True" if status else "False"
    old = next((c for c in conditions if c.type == kind), None)
    when = old.last_transition_time if old is not None and old.status == value else now()
    new = Condition(
        type=kind, status=value, reason=reason, message=message[:1000],
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
) -> TuningRunStatus:
    """`extra`: further top-level status fields (snake_case names of TuningRunStatus)."""
    prev = previous or TuningRunStatus()
    total = TrialCounts(
        **{f: sum(getattr(t, f) for t in targets) for f in TrialCounts.model_fields}
    )
    budget = sum(t.budget for t in targets)
    conditions = list(prev.conditions)
    terminal = phase in ("Succeeded", "Failed")
    degraded = phase == "Failed" or any(t.phase in ("Failed", "Unschedulable") for t in targets)
    conditions = set_condition(conditions, "Ready", phase == "Succeeded", reason, message, generation)
    conditions = set_condition(
        conditions, "Progressing", not terminal, reason if not terminal else "Finished", message, generation
    )
    conditions = set_condition(
        conditions,
        "Degraded",
        degraded,
        reason if degraded else "AsExpected",
        message if degraded else "",
        generation,
    )
    stale = [f"{t.name}: {t.stale}" for t in targets if t.stale]
    conditions = set_condition(
        conditions, "Stale", bool(stale), "FingerprintChanged" if stale else "UpToDate", "; ".join(stale), generation
    )
    return TuningRunStatus(
        phase=phase,  # type: ignore[arg-type]
        observed_generation=generation,
        progress=f"{total.completed}/{budget}",
        best_summary=_summary(targets),
        trials=total,
        targets=list(targets),
        results=results,  # type: ignore[arg-type]
        conditions=conditions,
        started_at=prev.started_at or now(),
        completed_at=(prev.completed_at or now()) if terminal else None,
        **(extra or {}),
    )
