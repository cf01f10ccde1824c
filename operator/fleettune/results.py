"""Turn a finished trial Job (and its Pods) into its records (pure).

The functions here decode the API's dicts: a Job's conditions and annotations, its Pods'
terminated states. The operator calls them once per Job and step, when the shell reads it
(`fleettune.controller.observed.parse_job`), and builds the records from what that
decoded (`batch_records`, `answered_records`); `records_from_job` does both for one Job's
dict.

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
from dataclasses import dataclass
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
    kernel: str | None = None  # the kernel's identity across runs (`controller.memory.kernel_id`)

    @property
    def is_observation(self) -> bool:
        return self.outcome != Outcome.INFRA_ERROR


@dataclass(frozen=True)
class StoredRun:
    """An earlier run's results store (its records of one kernel): a live run's, or one that
    outlives its deleted run (`fleetMemory.retainOnDelete`)."""

    namespace: str
    name: str
    uid: str
    retained: bool
    records: list[TrialRecord]

    def label(self, namespace: str) -> str:
        """The run's name, qualified with its namespace when it is another one."""
        return self.name if self.namespace == namespace else f"{self.namespace}/{self.name}"


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


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def job_finished(job: Mapping[str, Any]) -> bool:
    return _condition(job, "Complete") is not None or _condition(job, "Failed") is not None


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME:
            return (status.get("state") or {}).get("terminated")
    return None


def disrupted(pod: Mapping[str, Any]) -> bool:
    """Whether a Pod was disrupted (preempted, evicted, drained, its node lost): its Job's pod
    failure policy ignores that end and starts another Pod (`jobs.render_job`)."""
    return _condition(pod, "DisruptionTarget") is not None


def decisive_end(pod: Mapping[str, Any]) -> bool:
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


def _record(target: str, job: str, index: int, config: dict[str, Any], key: str, result: TrialResult,
            pod: Mapping[str, Any] | None, pool_round: int, problem_size: list[int] | None) -> TrialRecord:
    return TrialRecord(
        target=target,
        index=index,
        config=config,
        key=key,
        outcome=result.outcome,
        objective=result.objective,
        times=result.times[:16],
        fingerprint=result.fingerprint if result.fingerprint.product else None,
        error=result.error[:500],
        node=(pod or {}).get("spec", {}).get("nodeName"),
        job=job,
        round=pool_round,
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        problem_size=problem_size,
        compile_s=result.compile_s,
        run_s=result.run_s,
        pruned=result.pruned,
    )


def _finished_at(pod: Mapping[str, Any], term: Mapping[str, Any]) -> str:
    return term.get("finishedAt") or pod["metadata"].get("creationTimestamp") or ""


def job_failure(job: Mapping[str, Any]) -> str | None:
    """Why the Job controller failed a Job, as its records say it; None when it did not."""
    failed = _condition(job, "Failed")
    return None if failed is None else f"job failed ({failed.get('reason')}: {failed.get('message', '')})"


def records_from_job(
    job: dict[str, Any], pods: list[dict[str, Any]], batch: Batch, pool_round: int,
    problem_size: list[int] | None = None, answered_only: bool = False,
    streamed: Mapping[int, Answer] | None = None,
) -> list[TrialRecord]:
    """`batch_records` of a Job's dict (the operator reads its Jobs once, into
    `fleettune.controller.observed.ObservedJob`, and calls `batch_records` itself)."""
    return batch_records(
        target=job["metadata"]["labels"][TARGET_LABEL], job=job["metadata"]["name"],
        keys=config_keys(job, len(batch.entries)), failure=job_failure(job), batch=batch, pods=pods,
        pool_round=pool_round, problem_size=problem_size, answered_only=answered_only, streamed=streamed,
    )


def batch_records(
    *, target: str, job: str, keys: Sequence[str], failure: str | None, batch: Batch,
    pods: Sequence[Mapping[str, Any]], pool_round: int, problem_size: list[int] | None = None,
    answered_only: bool = False, streamed: Mapping[int, Answer] | None = None,
) -> list[TrialRecord]:
    """One record per entry of a finished trial Job (or one whose Pod's end decides it):
    Job ``job`` of pool ``target``, its entries' configuration keys ``keys`` (`config_keys`)
    and why the Job controller failed it, if it did (``failure``: `job_failure`).

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
    by_index = {e.index: e for e in batch.entries}
    answered: dict[int, tuple[TrialResult, Mapping[str, Any] | None]] = {}
    why: list[str] = []
    # Each Pod's end, decoded once: (Pod, its trial container's terminated state), oldest first.
    ended = sorted(((pod, term) for pod in pods if (term := _terminated(pod)) is not None),
                   key=lambda end: _finished_at(*end))
    for pod, term in ended:
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
    # The Pod that ended last (the first of equals, in the order the Pods were listed).
    last = max(ended, key=lambda end: _finished_at(*end))[0] if ended else None
    for index, answer in (streamed or {}).items():
        if index in by_index and index not in answered:
            answered[index] = (answer.result(Fingerprint()), last)
    if failure is not None and not why:
        why.append(failure)
    if not pods:
        why.append("no trial pod is left to read results from")
    missing = infra_failure("not measured: the batch ended before this configuration"
                            + (f" ({'; '.join(why)})" if why else ""))
    out = []
    for n, entry in enumerate(batch.entries):
        if answered_only and entry.index not in answered:
            continue
        result, by = answered.get(entry.index, (missing, last))
        out.append(_record(target, job, entry.index, entry.config, keys[n], result, by, pool_round, problem_size))
    return out


def answered_records(*, target: str, job: str, keys: Sequence[str], batch: Batch, answers: Mapping[int, Answer],
                     pool_round: int, problem_size: list[int] | None = None) -> list[TrialRecord]:
    """The records of a running trial Job's entries already answered in its Pod's log:
    provisional (the study learns from them, the status and the published best show them)
    until the Pod's termination message brings the same answers to the store."""
    return [_record(target, job, entry.index, entry.config, keys[n], answers[entry.index].result(Fingerprint()),
                    None, pool_round, problem_size)
            for n, entry in enumerate(batch.entries) if entry.index in answers]


def config_keys(job: Mapping[str, Any], n: int) -> list[str]:
    """The configuration key of each of a Job's ``n`` entries (its annotation); "" each
    where the annotation is missing or does not fit."""
    try:
        keys = json.loads(job["metadata"].get("annotations", {}).get(CONFIG_KEYS_ANNOTATION, "[]"))
    except ValueError:
        keys = []
    if not isinstance(keys, list) or len(keys) != n:
        keys = [""] * n
    return [str(k) for k in keys]
