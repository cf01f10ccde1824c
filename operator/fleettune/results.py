"""Turn a finished trial Job (and its Pods) into its records (pure: works on dicts).

Every trial Job is a batch (`fleettune.jobs`): the verdicts come from its Pods'
termination messages, one answer per configuration. What an answer says decides what the
record means: an invalid configuration (compile, launch, runtime, correctness, timeout) is
a *feasibility observation* the optimiser learns from; an infrastructure failure (no GPU,
lost Pod, garbled message, never started) is not an observation of the configuration at
all — it is counted, and the configuration may be tried again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, overload

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from fleettune.labels import CONFIG_KEYS_ANNOTATION, TARGET_LABEL
from fleettune_job.protocol import (
    CONTAINER_NAME,
    Answer,
    Batch,
    Fingerprint,
    Outcome,
    ProtocolError,
    TrialResult,
    decode_batch,
    infra_failure,
)


class TrialRecord(BaseModel):
    """One trial's outcome as stored durably (one JSON line in the results store).

    ``round`` is the pool's tuning round the trial belongs to (a re-tune starts the next),
    not the TuningRun's ``metadata.generation``. Records of earlier versions name it
    ``generation``: both keys are read, ``round`` is written.
    """

    model_config = ConfigDict(extra="ignore")

    target: str
    index: int
    config: dict[str, Any]
    key: str
    outcome: Outcome
    objective: float | None = None
    times: list[float] = Field(default_factory=list)
    fingerprint: Fingerprint | None = None
    error: str = ""
    node: str | None = None
    job: str = ""
    round: int = Field(default=1, validation_alias=AliasChoices("round", "generation"))
    recorded_at: str = ""
    problem_size: list[int] | None = None  # set when the run tunes several sizes
    compile_s: float | None = None  # as the job reports it (off the GPU when compiled ahead)
    run_s: float | None = None  # GPU seconds: first launch to the end of timing
    pruned: bool | None = None  # True: timed for 3 launches only, not verified (kernel.pruneSlowerThan)

    @property
    def is_observation(self) -> bool:
        return self.outcome != Outcome.INFRA_ERROR


class Records(Sequence[TrialRecord]):
    """Trial records in order, with each target's at hand: a step reads every pool's records
    several times (its search, its stopping rule, its status, what it publishes), and a
    long run holds thousands, most of them other pools'."""

    __slots__ = ("_all", "_by_target")

    def __init__(self, records: Iterable[TrialRecord] = ()) -> None:
        self._all = list(records)
        self._by_target: dict[str, list[TrialRecord]] = {}
        for rec in self._all:
            self._by_target.setdefault(rec.target, []).append(rec)

    def of(self, target: str) -> list[TrialRecord]:
        """The target's records, in order (the list is shared: not to be changed)."""
        return self._by_target.get(target, [])

    @overload
    def __getitem__(self, i: int) -> TrialRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[TrialRecord]: ...
    def __getitem__(self, i: int | slice) -> TrialRecord | list[TrialRecord]:
        return self._all[i]

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[TrialRecord]:
        return iter(self._all)


def _condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def job_finished(job: dict[str, Any]) -> bool:
    return _condition(job, "Complete") is not None or _condition(job, "Failed") is not None


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME:
            return (status.get("state") or {}).get("terminated")
    return None


def disrupted(pod: dict[str, Any]) -> bool:
    """Whether a Pod was disrupted (preempted, evicted, drained, its node lost): its Job's pod
    failure policy ignores that end and starts another Pod (`jobs.render_job`)."""
    return _condition(pod, "DisruptionTarget") is not None


def decisive_end(pod: dict[str, Any]) -> bool:
    """Whether a trial Pod's end already decides its Job's verdict, before the Job controller
    says so (it batches Pod updates for a second and takes two syncs to mark a Job Complete).

    A trial Job is never retried (backoffLimit 0), so any end is final, and the answers the
    Pod wrote must be read even when the Pod is deleted next; but a disrupted Pod's
    (`disrupted`): its Job starts another. The Pod must also be in a terminal phase: the
    scheduler frees its GPU only then.
    """
    if _terminated(pod) is None or (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        return False
    return not disrupted(pod)


def _last_pod(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    ended = [p for p in pods if _terminated(p) is not None]
    return max(ended, key=_finished_at) if ended else None


def _record(job: dict[str, Any], index: int, config: dict[str, Any], key: str, result: TrialResult,
            pod: dict[str, Any] | None, pool_round: int, problem_size: list[int] | None) -> TrialRecord:
    return TrialRecord(
        target=job["metadata"]["labels"][TARGET_LABEL],
        index=index,
        config=config,
        key=key,
        outcome=result.outcome,
        objective=result.objective,
        times=result.times[:16],
        fingerprint=result.fingerprint if result.fingerprint.product else None,
        error=result.error[:500],
        node=(pod or {}).get("spec", {}).get("nodeName"),
        job=job["metadata"]["name"],
        round=pool_round,
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        problem_size=problem_size,
        compile_s=result.compile_s,
        run_s=result.run_s,
        pruned=result.pruned,
    )


def _finished_at(pod: dict[str, Any]) -> str:
    term = _terminated(pod) or {}
    return term.get("finishedAt") or pod["metadata"].get("creationTimestamp") or ""


def records_from_job(
    job: dict[str, Any], pods: list[dict[str, Any]], batch: Batch, pool_round: int,
    problem_size: list[int] | None = None, answered_only: bool = False,
    streamed: Mapping[int, Answer] | None = None,
) -> list[TrialRecord]:
    """One record per entry of a finished trial Job (or one whose Pod's end decides it).

    Answers are read from every Pod that ended, oldest first: a Pod that died mid-batch
    still wrote the answers it finished, and the first answer of an entry wins (a second
    Pod may have measured it again). An answer for an index not in the batch is ignored.
    ``streamed``: the answers the operator read from the Pods' logs while they ran; they
    stand in where no termination message has one (a Pod whose node was lost before its
    status was written). An entry nobody answered is an infrastructure failure — not
    measured, so never counted as an invalid configuration — and the optimiser may suggest
    it again; with `answered_only` (a preempted batch: waiting, not failing) it has no
    record at all. Its error says why, in the Pods' words; in the Job's only where no Pod
    said anything, so that a record taken from a decisive Pod's end reads as one taken
    later from the failed Job."""
    keys = _config_keys(job, len(batch.entries))
    by_index = {e.index: e for e in batch.entries}
    answered: dict[int, tuple[TrialResult, dict[str, Any] | None]] = {}
    why: list[str] = []
    for pod in sorted((p for p in pods if _terminated(p) is not None), key=_finished_at):
        term = _terminated(pod) or {}
        try:
            message = decode_batch(term.get("message"))
        except ProtocolError as exc:
            why.append(f"{exc} (exit code {term.get('exitCode')}, reason {term.get('reason')})")
            continue
        if message.error:
            why.append(message.error)
        for answer in message.answers:
            if answer.i in by_index and answer.i not in answered:
                answered[answer.i] = (answer.result(message.fingerprint), pod)
    last = _last_pod(pods)
    for index, answer in (streamed or {}).items():
        if index in by_index and index not in answered:
            answered[index] = (answer.result(Fingerprint()), last)
    failed = _condition(job, "Failed")
    if failed is not None and not why:
        why.append(f"job failed ({failed.get('reason')}: {failed.get('message', '')})")
    if not pods:
        why.append("no trial pod is left to read results from")
    missing = infra_failure("not measured: the batch ended before this configuration"
                            + (f" ({'; '.join(why)})" if why else ""))
    out = []
    for n, entry in enumerate(batch.entries):
        if answered_only and entry.index not in answered:
            continue
        result, by = answered.get(entry.index, (missing, last))
        out.append(_record(job, entry.index, entry.config, keys[n], result, by, pool_round, problem_size))
    return out


def early_records(job: dict[str, Any], batch: Batch, answers: Mapping[int, Answer], pool_round: int,
                  problem_size: list[int] | None = None) -> list[TrialRecord]:
    """The records of a running trial Job's entries already answered in its Pod's log:
    provisional (the study learns from them, the status and the published best show them)
    until the Pod's termination message brings the same answers to the store."""
    keys = _config_keys(job, len(batch.entries))
    return [_record(job, entry.index, entry.config, keys[n], answers[entry.index].result(Fingerprint()), None,
                    pool_round, problem_size)
            for n, entry in enumerate(batch.entries) if entry.index in answers]


def _config_keys(job: dict[str, Any], n: int) -> list[str]:
    try:
        keys = json.loads(job["metadata"].get("annotations", {}).get(CONFIG_KEYS_ANNOTATION, "[]"))
    except ValueError:
        keys = []
    if not isinstance(keys, list) or len(keys) != n:
        keys = [""] * n
    return [str(k) for k in keys]
