"""An in-memory stand-in for the cluster, to drive the planner through whole runs.

It plays the part of the I/O shell (`fleettune.controller.tuner.RunLoop`) and of the
Job controller: it keeps the Jobs the planner creates, finishes them with the result a
`measure` function gives (as a trial Pod's termination message, exactly what the job
image writes), stores records, and holds the nodes. Only the planner's decisions are
real; the shell itself is proven on the real control plane by the integration tests.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleettune.api import TuningRunStatus
from fleettune.controller.observed import parse_job, seen
from fleettune.controller.plan import Observed, Plan, RecordKey, pods_needed
from fleettune.controller.planner import Planner
from fleettune.controller.reporting import Report
from fleettune.jobs import work_of
from fleettune.labels import BATCH_LABEL, TARGET_LABEL
from fleettune.results import StoredRun, TrialRecord, job_finished
from fleettune_job.protocol import CONTAINER_NAME, Answer, BatchResult, TrialResult

Measure = Callable[[dict[str, Any]], TrialResult]
A100 = {
    "nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB", "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver-version.full": "550.54.15",
    "nvidia.com/cuda.runtime-version.full": "12.4",
}


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class MemoryStore:
    def __init__(self) -> None:
        self.records: list[TrialRecord] = []
        self.keys: set[RecordKey] = set()

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def append(self, records: list[TrialRecord]) -> list[TrialRecord]:
        fresh = [r for r in records if (r.round, r.target, r.index) not in self.keys]
        self.records += fresh
        self.keys |= {(r.round, r.target, r.index) for r in fresh}
        return fresh


@dataclass
class FakeFleet:
    spec: dict[str, Any]
    measure: Measure
    nodes: dict[str, dict[str, str]] = field(default_factory=lambda: {"gpu-0": dict(A100), "gpu-1": dict(A100)})
    wall: float = 1_000_000.0
    mono: float = 100.0
    generation: int = 1
    annotations: dict[str, str] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    store: MemoryStore = field(default_factory=MemoryStore)
    created: list[str] = field(default_factory=list)  # every Job name ever created, in order
    deleted: list[str] = field(default_factory=list)
    node_epoch: int = 0
    status: dict[str, Any] | None = None
    node_wait_s: float = 600.0
    # GPUs each node offers (status.allocatable), and so how many trial Pods start at once;
    # None: the nodes do not say, and every Job's Pod starts.
    gpus_per_node: int | None = None
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    ended: dict[str, dict[str, Any]] = field(default_factory=dict)  # Job name -> its Pod the watch saw end
    # Job name -> the answers its running Pod printed (what the operator read from its log).
    streamed: dict[str, dict[int, Answer]] = field(default_factory=dict)
    # The fleet's memory: earlier runs' stores, as the shell's reader finds them (every kernel's).
    memory: list[StoredRun] = field(default_factory=list)
    memory_problems: list[str] = field(default_factory=list)
    memory_reads: int = 0
    planner: Planner = field(init=False)

    def __post_init__(self) -> None:
        self.planner = self.new_planner()

    def new_planner(self) -> Planner:
        """A planner as after an operator restart: it knows only the status and the store."""
        planner = Planner("conv", "ns", "uid-1", logging.getLogger("planner-test"), self.node_wait_s)
        planner.restore(TuningRunStatus.model_validate(self.status) if self.status else None)
        return planner

    # ------------------------------------------------------------------ the world changes

    def edit(self, **spec: Any) -> None:
        self.spec = {**self.spec, **spec}
        self.generation += 1

    def set_nodes(self, nodes: dict[str, dict[str, str]]) -> None:
        self.nodes = nodes
        self.node_epoch += 1

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def start_pods(self) -> None:
        """The scheduler and kubelet: Pods of admitted Jobs start (the Job controller counts
        them ready) while a GPU is free; the others stay Pending."""
        free = None if self.gpus_per_node is None else self.gpus_per_node * len(self.nodes)
        for job in self.jobs.values():
            if job_finished(job) or job["spec"].get("suspend"):
                continue
            status = job.setdefault("status", {})
            if status.get("ready"):
                free = None if free is None else free - 1
            elif free is None or free > 0:
                status["ready"] = 1
                free = None if free is None else free - 1

    def pending(self) -> list[dict[str, Any]]:
        """The Jobs whose Pod waits for a GPU."""
        return [j for j in self.running() if not (j.get("status") or {}).get("ready")]

    def running(self) -> list[dict[str, Any]]:
        """The Jobs that run now: not finished, and not held by a queue (suspended)."""
        return [j for j in self.jobs.values() if not job_finished(j) and not j["spec"].get("suspend")]

    def admit(self, n: int | None = None) -> list[str]:
        """Kueue admits the first `n` waiting Jobs (all: None): it un-suspends them."""
        waiting = [j for j in self.jobs.values() if j["spec"].get("suspend") and not job_finished(j)][:n]
        for job in waiting:
            job["spec"]["suspend"] = False
            job["status"] = {"conditions": [{"type": "Suspended", "status": "False", "reason": "JobResumed",
                                             "lastTransitionTime": iso(self.wall)}]}
        return [j["metadata"]["name"] for j in waiting]

    def preempt(self, name: str, answered: int = 0) -> None:
        """Kueue suspends a running Job again; the Job controller ends its Pod, which (a batch)
        wrote its first `answered` answers, as the job image does on SIGTERM."""
        job = self.jobs[name]
        job["spec"]["suspend"] = True
        job["status"] = {"conditions": [{"type": "Suspended", "status": "True", "reason": "JobSuspended",
                                         "lastTransitionTime": iso(self.wall)}]}
        work = work_of(job)
        entries = work.entries[:answered]
        message = BatchResult(answers=[Answer.of(e.index, self.measure(e.config)) for e in entries],
                              done=False, error="terminated by SIGTERM")
        self.ended[name] = {
            "metadata": {"name": f"{name}-pod", "labels": {BATCH_LABEL: "true"}},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": CONTAINER_NAME, "state": {"terminated": {"exitCode": 143, "message": message.encode()}}}]}}

    def print_answers(self, name: str, n: int) -> list[Answer]:
        """The running batch Pod of Job `name` prints its first `n` answers on its log."""
        work = work_of(self.jobs[name])
        answers = [Answer.of(e.index, self.measure(e.config)) for e in work.entries[:n]]
        self.streamed[name] = {a.i: a for a in answers}
        return answers

    def lose_node(self, name: str) -> None:
        """The node of Job `name`'s Pod is deleted: the Pod goes with its termination
        message, the Job fails with no Pod left to read."""
        job = self.jobs[name]
        job["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
        job["pods"] = []

    def finish(self, n: int | None = None, answered: int | None = None) -> None:
        """The Job controller marks the first `n` running Jobs (all: None) done with their
        results. Its Pod answers its first `answered` trials (None: all) and is killed after
        them, as a deletion would (exit 137, the Job failed)."""
        self.start_pods()
        for job in [j for j in self.running() if j["status"].get("ready")][:n]:
            work = work_of(job)
            entries = work.entries if answered is None else work.entries[:answered]
            done = len(entries) == len(work.entries)
            message = BatchResult(answers=[Answer.of(e.index, self.measure(e.config)) for e in entries],
                                  done=done, error="" if done else "terminated by SIGKILL")
            ok, code, text = done, 0 if done else 137, message.encode()
            job["status"] = {"conditions": [{"type": "Complete" if ok else "Failed", "status": "True"}]}
            pod = {"metadata": {"name": f"{job['metadata']['name']}-pod"},
                   "status": {"phase": "Succeeded" if ok else "Failed", "containerStatuses": [{
                       "name": CONTAINER_NAME, "state": {"terminated": {"exitCode": code, "message": text}}}]}}
            job["pods"] = [pod]

    # ------------------------------------------------------------------ one step of the shell

    def step(self) -> Plan:
        planner = self.planner
        planner.configure(self.generation, copy.deepcopy(self.spec), self.store.records, self.wall)
        if planner.spec is not None and planner.wants_source(self.mono):
            source = planner.spec.kernel.source
            assert source is not None
            planner.accept_source(self.config_maps.get(source.config_map), self.mono, self.wall)
        if planner.wants_warm_start(self.mono):
            assert planner.spec is not None and planner.spec.warm_start
            planner.accept_warm_start([self.config_maps.get(w.config_map) for w in planner.spec.warm_start], self.mono)
        if (blocked := planner.blocked()) is not None:
            return self._report(Plan(report=blocked))
        if (kernel := planner.wants_memory(self.mono)) is not None:
            self.memory_reads += 1
            runs = [StoredRun(r.namespace, r.name, r.uid, r.retained, [x for x in r.records if x.kernel == kernel])
                    for r in self.memory]
            planner.accept_memory(kernel, [r for r in runs if r.records], self.memory_problems, self.mono)
        planner.retune(self.annotations, self.wall)
        if planner.wants_nodes(self.node_epoch, self.mono):
            nodes = [{"metadata": {"name": n, "labels": labels}, "spec": {}} for n, labels in self.nodes.items()]
            if self.gpus_per_node is not None:
                for node in nodes:
                    node["status"] = {"allocatable": {"cpu": "8", "nvidia.com/gpu": str(self.gpus_per_node)}}
            planner.accept_nodes(nodes, self.node_epoch, self.mono)
        self.start_pods()
        # Read as the shell reads them: each Job parsed once, then its Pods and answers added.
        jobs = [parse_job(copy.deepcopy({k: v for k, v in j.items() if k != "pods"})) for j in self.jobs.values()]
        ended = {name: pod for name, pod in self.ended.items() if name in self.jobs}
        needed = pods_needed(jobs, ended, self.store)
        pods = {j.name: self.jobs[j.name]["pods"] for j in needed}
        streamed = {name: dict(answers) for name, answers in self.streamed.items() if name in self.jobs}
        plan = planner.plan(Observed(wall=self.wall, mono=self.mono, jobs=seen(jobs, ended, pods, streamed),
                                     records=self.store.records, stored=self.store))
        self.store.append(plan.records)
        for name in plan.delete_now + plan.delete_after:
            self.deleted.append(name)
            self.jobs.pop(name, None)
        for body in plan.create:
            name = body["metadata"]["name"]
            assert name not in self.jobs, f"{name} created twice"
            self.jobs[name] = copy.deepcopy(body)
            self.jobs[name]["metadata"]["creationTimestamp"] = iso(self.wall)
            self.created.append(name)
        return self._report(plan)

    def _report(self, plan: Plan) -> Plan:
        assert plan.report is not None
        body = {"metadata": {"name": "conv", "namespace": "ns", "generation": self.generation},
                "spec": self.spec}
        previous = TuningRunStatus.model_validate(self.status) if self.status else None
        results = {"configMapPrefix": "conv-results", "shards": 0, "records": len(self.store.records)}
        self.status = self.planner.reporter.status(plan.report, previous=previous, body=body, results=results,
                                                   published=None, published_name=None,
                                                   extra=self.planner.status_fields())
        return plan

    def run(self, steps: int = 200, per_step: float = 10.0) -> Report:
        """Step, admitting (a queue) and finishing every Job after each step, until the run is finished."""
        for _ in range(steps):
            plan = self.step()
            if plan.finished:
                assert plan.report is not None
                return plan.report
            self.admit()
            self.finish()
            self.advance(per_step)
        raise AssertionError(f"not finished after {steps} steps: {self.status}")

    def target(self, name: str = "a100") -> dict[str, Any]:
        assert self.status is not None
        return next(t for t in self.status["targets"] if t["name"] == name)

    def records_of(self, target: str = "a100") -> list[TrialRecord]:
        return [r for r in self.store.records if r.target == target]

    def jobs_of(self, target: str = "a100") -> list[dict[str, Any]]:
        return [j for j in self.jobs.values() if j["metadata"]["labels"][TARGET_LABEL] == target]
