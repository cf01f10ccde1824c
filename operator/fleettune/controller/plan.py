"""One step's input and output: what the shell read (`Observed`), what the planner decided
(`Plan`), and what the run's trial Jobs say (pure).

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

from fleettune.controller.reporting import Report
from fleettune.jobs import STALL_GRACE_S, entries_of, from_earlier_version, past_deadline_s, suspended, work_of
from fleettune.labels import ROUND_LABEL, TARGET_LABEL, TRIAL_LABEL
from fleettune.metrics import TrialTimings, trial_timings
from fleettune.results import TrialRecord, early_records, job_finished, records_from_job
from fleettune.sizes import size_of_key
from fleettune_job.protocol import Answer, Batch

Job = dict[str, Any]
RecordKey = tuple[int, str, int]  # (round, pool key, trial index): what the store is keyed by




def round_of(job: Job) -> int:
    return int(job["metadata"].get("labels", {}).get(ROUND_LABEL, "1"))


def job_labels(job: Job) -> tuple[str, int]:
    labels = job["metadata"].get("labels", {})
    return labels.get(TARGET_LABEL, ""), int(labels.get(TRIAL_LABEL, "-1"))


@dataclass(frozen=True)
class Observed:
    """What the shell read for one step."""

    wall: float  # epoch seconds: deadlines count from a round's start, which the status keeps
    mono: float  # monotonic seconds: rate limits and re-checks
    jobs: Sequence[Job]  # the run's trial Jobs
    records: Sequence[TrialRecord]  # the results store's records
    stored: Container[RecordKey]  # the store's keys
    ended: Mapping[str, Job] = field(default_factory=dict)  # Job name -> its Pod whose end decides it
    pods: Mapping[str, list[Job]] = field(default_factory=dict)  # Job name -> Pods, for `pods_needed`
    # Job name -> the answers its running Pod printed so far (`watch.StreamedAnswers`).
    answers: Mapping[str, Mapping[int, Answer]] = field(default_factory=dict)


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
    create: list[Job] = field(default_factory=list)
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

    def hand_back(self, target: str, job: Job, answered: Container[int]) -> int:
        """Into `requeue`: the entries of deleted Job `job` that its Pod did not answer; how many."""
        back = [(i, c) for i, c in entries_of(job) if i not in answered]
        self.requeue.setdefault(target, []).extend(back)
        return len(back)

    @property
    def finished(self) -> bool:
        return self.report is not None and self.report.finished and not self.settling


def job_gist(job: Job) -> tuple[bool, bool]:
    """What in a Job a run's step acts on (`collect`): whether it finished, and whether its
    queue holds it. A Job's other updates (its Pod active, ready, counted) wake no step."""
    return job_finished(job), suspended(job)


def recorded(job: Job, stored: Container[RecordKey]) -> bool:
    """Whether every trial of the Job is in the store (a batch's records are stored together;
    checking each also covers a crash between two writes)."""
    target, _ = job_labels(job)
    return all((round_of(job), target, index) in stored for index, _ in entries_of(job))


def pods_needed(jobs: Sequence[Job], ended: Mapping[str, Job], stored: Container[RecordKey]) -> list[Job]:
    """The finished Jobs whose Pods must be read to record them (no decisive Pod seen)."""
    return [job for job in jobs
            if job_finished(job) and job["metadata"]["name"] not in ended and not recorded(job, stored)]


def _size(target: str, work: Batch) -> list[int] | None:
    """The problem size to record: the work's, when the pool is one of several sizes."""
    return work.problem_size if size_of_key(target) is not None else None


def _stalled(job: Job, target: str, late_s: float, obs: Observed, plan: Plan) -> None:
    """Into `plan`: delete a stalled Job (`jobs.STALL_GRACE_S`), keep what its Pod answered in
    its log, and hand its other configurations back to the pool."""
    name = job["metadata"]["name"]
    work = work_of(job)
    kept: list[TrialRecord] = []
    if answers := obs.answers.get(name):
        kept = early_records(job, work, answers, round_of(job), _size(target, work))
    plan.records += [r for r in kept if (r.round, r.target, r.index) not in obs.stored]
    answered = {r.index for r in kept}
    back = plan.hand_back(target, job, answered)
    plan.delete_now.append(name)
    plan.stalled.append((name, target, late_s, len(answered), back))


def collect(obs: Observed, plan: Plan, rounds: Mapping[str, int]) -> dict[str, list[Job]]:
    """Into `plan`: the records of the finished Jobs, and of Jobs whose Pod's end already
    decides them (settling: neither running nor deletable until the Job controller is done
    with them), and which Jobs to delete; returns the running Jobs per pool (`rounds`: the
    current round of each pool)."""
    running: dict[str, list[Job]] = {}
    for job in obs.jobs:
        name = job["metadata"]["name"]
        target, _ = job_labels(job)
        ended = obs.ended.get(name)
        if from_earlier_version(job):
            if not recorded(job, obs.stored):
                back = plan.hand_back(target, job, ()) if rounds.get(target) == round_of(job) else 0
                plan.superseded.append((name, target, back))
            plan.delete_now.append(name)
            continue
        if not job_finished(job) and ended is None:
            if rounds.get(target) != round_of(job):
                # A trial of a removed pool, or of an older round (older driver or space),
                # would only measure the past.
                plan.delete_now.append(name)
            elif (late := past_deadline_s(job, obs.wall)) is not None and late > STALL_GRACE_S:
                _stalled(job, target, late, obs, plan)
            else:
                running.setdefault(target, []).append(job)
                if answers := obs.answers.get(name):
                    work = work_of(job)
                    plan.early += early_records(job, work, answers, round_of(job), _size(target, work))
            continue
        # Finished, or its Pod's end already decides it: no need to wait for the Job
        # controller to record it and start the next trial. Deleting it can wait: a Job
        # deleted before the Job controller is done with it leaves its Pod to the slower
        # orphan path (the tracking finalizer), and the Pod lingers.
        if not recorded(job, obs.stored):
            pods = [ended] if ended is not None else obs.pods.get(name)
            if pods is None:
                continue  # its Pods were not read: recorded (and deleted) on a later step
            work = work_of(job)
            size = _size(target, work)
            preempted = suspended(job) and not job_finished(job)
            new = records_from_job(job, pods, work, round_of(job), size, answered_only=preempted,
                                   streamed=obs.answers.get(name))
            if preempted and rounds.get(target) == round_of(job):
                answered = {r.index for r in new}
                back = plan.hand_back(target, job, answered)
                plan.preempted.append((name, target, len(answered), back))
            # A record already stored (a crash between two of a batch's writes) is not stored twice.
            plan.records += [r for r in new if (r.round, r.target, r.index) not in obs.stored]
            plan.timings[name] = trial_timings(job, pods)
        if suspended(job) and not job_finished(job):
            plan.delete_now.append(name)  # never re-admitted: it would measure its answered configurations again
        elif ended is None:
            plan.delete_after.append(name)
        else:
            plan.settling = True
    return running
