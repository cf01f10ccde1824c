"""One step's input and output: what the shell read (`Observed`), what the planner decided
(`Plan`), and what the run's trial Jobs say (pure). The Jobs come decoded
(`fleettune.controller.observed.ObservedJob`): nothing here reads a Job's dict.

A Job is decided when the Job controller marks it Complete or Failed, or earlier, when the
watch saw its Pod end decisively (`results.decisive_end`): the record is taken then, so
the pool's next trial starts at once, and the Job is deleted once the Job controller is
done with it (one deleted earlier leaves its Pod to the slower orphan path). Every trial
Job is a batch (a batch of one where a Pod measures one configuration); it gives one
record per configuration, stored together.

A Job suspended again after its Pod ran (Kueue preempted it) is waiting, not failing: the
answers its Pod wrote are kept; the configurations it did not answer are handed back to
its pool (`Plan.requeue`) and the Job is deleted, so that a re-admission never measures the
answered ones twice.

A one-configuration Job of an operator before every Job was a batch
(`jobs.from_earlier_version`), still running after an upgrade or ended and not recorded,
is deleted and its configuration handed back the same way: measured again, first, in a
batch Job; its protocol is no longer read.

A Job the Job controller has lost track of (still running `jobs.STALL_GRACE_S` past its
deadline) is deleted the same way: what its Pod answered is kept, the rest is measured
again in a new Job.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleettune.controller.observed import JobBody, ObservedJob, RecordKey
from fleettune.controller.reporting import Report
from fleettune.jobs import STALL_GRACE_S
from fleettune.metrics import TrialTimings
from fleettune.results import TrialRecord

__all__ = ["Observed", "Plan", "RecordKey", "Suggested", "collect", "pods_needed"]


@dataclass(frozen=True)
class Observed:
    """What the shell read for one step."""

    wall: float  # epoch seconds: deadlines count from a round's start, which the status keeps
    mono: float  # monotonic seconds: rate limits and re-checks
    # The run's trial Jobs, each with its Pods (`pods_needed`, or the one whose end decides
    # it) and the answers its running Pod printed so far.
    jobs: Sequence[ObservedJob]
    records: Sequence[TrialRecord]  # the results store's records
    stored: Container[RecordKey]  # the store's keys


@dataclass(frozen=True)
class Suggested:
    target: str
    seconds: float  # the whole suggestion, in the worker
    fit_seconds: float | None  # of it, fitting the models (None: the strategy fitted none)


@dataclass
class Plan:
    """What the shell does with one step: store the records, delete `delete_now`, create
    `create` (alongside the store's write when nothing is deleted first), then delete
    `delete_after` (Jobs whose records are stored) alongside the status write."""

    records: list[TrialRecord] = field(default_factory=list)
    timings: dict[str, TrialTimings] = field(default_factory=dict)  # by Job name: its Pod's
    delete_now: list[str] = field(default_factory=list)
    create: list[JobBody] = field(default_factory=list)  # rendered for the API (`jobs.render_job`)
    delete_after: list[str] = field(default_factory=list)
    suggested: list[Suggested] = field(default_factory=list)
    report: Report | None = None
    # Recorded Jobs the Job controller has not marked done yet: deleted on a later step.
    settling: bool = False
    # Pool key -> the entries (index, configuration) of deleted Jobs that no Pod answered
    # (preempted, stalled): measured first, again (`Pool.hand_back`).
    requeue: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    preempted: list[tuple[str, str, int, int]] = field(default_factory=list)  # (Job, pool, answered, re-queued)
    # (Job, pool, seconds past its deadline, answered, re-queued): Jobs the Job controller lost track of.
    stalled: list[tuple[str, str, float, int, int]] = field(default_factory=list)
    # (Job, pool, re-queued): one-configuration Jobs of an earlier version, deleted.
    superseded: list[tuple[str, str, int]] = field(default_factory=list)
    # Provisional records of the entries running Pods have answered in their logs: learnt
    # from and reported, not stored (the termination message brings them to the store).
    early: list[TrialRecord] = field(default_factory=list)

    def hand_back(self, job: ObservedJob, answered: Container[int]) -> int:
        """Into `requeue`: the entries of deleted Job `job` that its Pod did not answer; how many."""
        back = [(i, c) for i, c in job.entries if i not in answered]
        self.requeue.setdefault(job.target, []).extend(back)
        return len(back)

    @property
    def finished(self) -> bool:
        return self.report is not None and self.report.finished and not self.settling


def pods_needed(jobs: Sequence[ObservedJob], ended: Container[str], stored: Container[RecordKey]) -> list[ObservedJob]:
    """The finished Jobs whose Pods must be read to record them (no decisive Pod seen:
    ``ended`` names the Jobs with one)."""
    return [job for job in jobs if job.finished and job.name not in ended and not job.recorded(stored)]


def _stalled(job: ObservedJob, late_s: float, obs: Observed, plan: Plan) -> None:
    """Into `plan`: delete a stalled Job (`jobs.STALL_GRACE_S`), keep what its Pod answered in
    its log, and hand its other configurations back to the pool."""
    kept = job.early
    plan.records += [r for r in kept if (r.round, r.target, r.index) not in obs.stored]
    answered = {r.index for r in kept}
    back = plan.hand_back(job, answered)
    plan.delete_now.append(job.name)
    plan.stalled.append((job.name, job.target, late_s, len(answered), back))


def collect(obs: Observed, plan: Plan, rounds: Mapping[str, int]) -> dict[str, list[ObservedJob]]:
    """Into `plan`: the records of the finished Jobs, and of Jobs whose Pod's end already
    decides them (settling: neither running nor deletable until the Job controller is done
    with them), and which Jobs to delete; returns the running Jobs per pool (`rounds`: the
    current round of each pool)."""
    running: dict[str, list[ObservedJob]] = {}
    for job in obs.jobs:
        name, target = job.name, job.target
        if job.earlier_version:
            if not job.recorded(obs.stored):
                back = plan.hand_back(job, ()) if rounds.get(target) == job.round else 0
                plan.superseded.append((name, target, back))
            plan.delete_now.append(name)
            continue
        if not job.finished and not job.decided:
            if rounds.get(target) != job.round:
                # A trial of a removed pool, or of an older round (older driver or space),
                # would only measure the past.
                plan.delete_now.append(name)
            elif (late := job.past_deadline_s(obs.wall)) is not None and late > STALL_GRACE_S:
                _stalled(job, late, obs, plan)
            else:
                running.setdefault(target, []).append(job)
                plan.early += job.early
            continue
        # Finished, or its Pod's end already decides it: no need to wait for the Job
        # controller to record it and start the next trial. Deleting it can wait: a Job
        # deleted before the Job controller is done with it leaves its Pod to the slower
        # orphan path (the tracking finalizer), and the Pod lingers.
        if not job.recorded(obs.stored):
            new = job.records
            if new is None:
                continue  # its Pods were not read: recorded (and deleted) on a later step
            if job.preempted and rounds.get(target) == job.round:
                answered = {r.index for r in new}
                back = plan.hand_back(job, answered)
                plan.preempted.append((name, target, len(answered), back))
            # A record already stored (a crash between two of a batch's writes) is not stored twice.
            plan.records += [r for r in new if (r.round, r.target, r.index) not in obs.stored]
            plan.timings[name] = job.timings
        if job.preempted:
            plan.delete_now.append(name)  # never re-admitted: it would measure its answered configurations again
        elif not job.decided:
            plan.delete_after.append(name)
        else:
            plan.settling = True
    return running
