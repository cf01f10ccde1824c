"""The run's trial Jobs as one step read them, each decoded once (pure).

The I/O shell (`fleettune.controller.tuner`) reads a run's Jobs, the Pods of those it must
record, and the answers running Pods printed, all as the API's dicts. `parse_job` decodes
each Job into an `ObservedJob` as soon as it is read; `seen` adds what else the shell read
about each (`ObservedJob.seen_with`). Past the read step nothing looks into a Job's dict
again: the planner (`controller.plan`, `.planner`, `.trials`, `.batches`, `.reporting`)
works on these frozen objects, and what a Job and its Pods give (its records, its timings)
is derived once, on first use. A Job the planner renders is a dict for the API
(`JobBody`, `Plan.create`), and is parsed like any other where the step counts it as
running.

The names of the API's dicts (`JobBody`, `PodBody`, `NodeBody`) are for the I/O edge: the
Kubernetes adaptor, the handlers and the watch caches. A Job's Pods stay dicts inside
their `ObservedJob`: only `results.batch_records` and `metrics.pod_timings` read them,
each once.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from fleettune.jobs import deadline_at, from_earlier_version, suspended, suspended_since, work_of
from fleettune.labels import ROUND_LABEL, TARGET_LABEL
from fleettune.metrics import TrialTimings, job_times, pod_timings
from fleettune.results import TrialRecord, answered_records, batch_records, config_keys, job_failure, job_finished
from fleettune.sizes import size_of_key
from fleettune_job.protocol import Answer, Batch

JobBody = dict[str, Any]  # a batch/v1 Job as the API returns it, or as rendered to create
PodBody = dict[str, Any]  # a v1 Pod as the API (or a watch) returns it
NodeBody = dict[str, Any]  # a v1 Node as the API (or a watch) returns it
RecordKey = tuple[int, str, int]  # (round, pool key, trial index): what the store is keyed by


@dataclass(frozen=True, eq=False)
class ObservedJob:
    """One trial Job as a step read it (`parse_job`), with its Pods and answers (`seen_with`)."""

    name: str
    uid: str | None
    target: str  # the key of its pool (TARGET_LABEL)
    round: int  # the pool's round it measures for (ROUND_LABEL)
    work: Batch  # what it measures (`jobs.work_of`)
    entries: tuple[tuple[int, dict[str, Any]], ...]  # (index, configuration) of each trial
    keys: tuple[str, ...]  # each entry's configuration key ("" where the Job does not say)
    earlier_version: bool  # a one-configuration Job of an earlier operator (`jobs.from_earlier_version`)
    finished: bool  # the Job controller marked it Complete or Failed
    failure: str | None  # why the Job controller failed it (`results.job_failure`)
    suspended: bool  # its queue holds it (`jobs.suspended`)
    suspended_since: str | None  # when its queue last took it (`jobs.suspended_since`)
    started: bool  # its Pod runs (the Job controller counts it ready), not Pending
    deadline_at: float | None  # epoch seconds (`jobs.deadline_at`)
    created: datetime | None  # its creation and last admission (`metrics.job_times`)
    admitted: datetime | None
    # Its Pod whose end decides it, seen on the Pod watch before the Job controller said so.
    decided: bool = False
    # The Pods its records are read from (its deciding Pod alone, when `decided`); None:
    # not read this step.
    pods: tuple[PodBody, ...] | None = None
    # What its running Pod printed so far (`watch.StreamedAnswers`), by entry index.
    answers: Mapping[int, Answer] = field(default_factory=dict)
    # What is derived from the above, once (`records`, `early`, `timings`). Not
    # functools.cached_property: on Python 3.11 it holds one lock for every instance, and
    # the runs' planners run in parallel threads.
    _derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def seen_with(self, *, ended: PodBody | None = None, pods: Sequence[PodBody] | None = None,
                  answers: Mapping[int, Answer] | None = None) -> ObservedJob:
        """This Job with what else the shell read: its Pod whose end decides it (``ended``,
        which then stands for its Pods), the Pods listed for it, its streamed answers."""
        read = (ended,) if ended is not None else tuple(pods) if pods is not None else None
        return replace(self, decided=ended is not None, pods=read, answers=dict(answers or {}))

    @property
    def preempted(self) -> bool:
        """Suspended again by its queue before it finished: waiting, not failing."""
        return self.suspended and not self.finished

    @property
    def problem_size(self) -> list[int] | None:
        """The problem size its records carry: its work's, when its pool is one of several sizes."""
        return self.work.problem_size if size_of_key(self.target) is not None else None

    def past_deadline_s(self, wall: float) -> float | None:
        """Seconds past its deadline at ``wall`` (negative: before it); None without one."""
        return None if self.deadline_at is None else wall - self.deadline_at

    def recorded(self, stored: Container[RecordKey]) -> bool:
        """Whether every trial of the Job is in the store (a batch's records are stored together;
        checking each also covers a crash between two writes)."""
        return all((self.round, self.target, index) in stored for index, _ in self.entries)

    @property
    def records(self) -> tuple[TrialRecord, ...] | None:
        """One record per entry, from its Pods (`results.batch_records`); a preempted Job's
        answered entries only. None when its Pods were not read."""
        if "records" not in self._derived:
            self._derived["records"] = None if self.pods is None else tuple(batch_records(
                target=self.target, job=self.name, keys=self.keys, failure=self.failure, batch=self.work,
                pods=self.pods, pool_round=self.round, problem_size=self.problem_size,
                answered_only=self.preempted, streamed=self.answers,
            ))
        records: tuple[TrialRecord, ...] | None = self._derived["records"]
        return records

    @property
    def early(self) -> tuple[TrialRecord, ...]:
        """The provisional records of the entries its running Pod answered in its log."""
        if "early" not in self._derived:
            self._derived["early"] = tuple(answered_records(
                target=self.target, job=self.name, keys=self.keys, batch=self.work, answers=self.answers,
                pool_round=self.round, problem_size=self.problem_size)) if self.answers else ()
        early: tuple[TrialRecord, ...] = self._derived["early"]
        return early

    @property
    def timings(self) -> TrialTimings:
        """Its Pods' run time and waits (`metrics.pod_timings`)."""
        if "timings" not in self._derived:
            self._derived["timings"] = pod_timings(self.created, self.admitted, self.pods or ())
        timings: TrialTimings = self._derived["timings"]
        return timings


def parse_job(body: Mapping[str, Any]) -> ObservedJob:
    """A trial Job's dict, decoded: the one place the operator reads a Job's fields."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    work = work_of(body)
    created, admitted = job_times(body)
    return ObservedJob(
        name=meta["name"], uid=meta.get("uid"), target=labels.get(TARGET_LABEL, ""),
        round=int(labels.get(ROUND_LABEL, "1")), work=work,
        entries=tuple((e.index, e.config) for e in work.entries),
        keys=tuple(config_keys(body, len(work.entries))), earlier_version=from_earlier_version(body),
        finished=job_finished(body), failure=job_failure(body), suspended=suspended(body),
        suspended_since=suspended_since(body), started=int((body.get("status") or {}).get("ready") or 0) > 0,
        deadline_at=deadline_at(body), created=created, admitted=admitted,
    )


def seen(jobs: Iterable[ObservedJob], ended: Mapping[str, PodBody], pods: Mapping[str, Sequence[PodBody]],
         answers: Mapping[str, Mapping[int, Answer]]) -> list[ObservedJob]:
    """Each Job with what else the shell read of it, by Job name (`ObservedJob.seen_with`):
    the Pod whose end decides it, its Pods as listed, what its running Pod printed."""
    return [job.seen_with(ended=ended.get(job.name), pods=pods.get(job.name), answers=answers.get(job.name))
            for job in jobs]


def job_gist(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """What in a Job a run's step acts on (`controller.plan.collect`): whether it finished,
    and whether its queue holds it. A Job's other updates (its Pod active, ready, counted)
    wake no step. (The Job watch's filter: a Job's dict, not parsed whole.)"""
    return job_finished(body), suspended(body)
