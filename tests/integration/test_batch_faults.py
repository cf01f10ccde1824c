"""Batched trial Pods on the real control plane: a batch Pod killed half-way,
garbled batch results, and a whole run on the simulator. Whatever happens to a batch Pod,
every configuration it finished is recorded once, the others are tried again, and nothing
is recorded as invalid that was not measured invalid."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from typing import Any

import pytest
from fault_support import (
    KILLED_EXIT_CODE,
    PodCompleter,
    Reply,
    assert_restricted,
    bad_batch_message,
    batch_message,
    ok_answers,
    ok_batch_reply,
    ok_reply,
    ok_time,
    tracebacks,
)
from operator_support import OperatorProcess, apply, example, get_run, stored_records, wait_for, wait_phase

from fleettune.labels import BATCH_LABEL, RUN_LABEL
from fleettune.results import TrialRecord
from fleettune_dev.sim.simulator import FleetSimulator
from fleettune_job.protocol import CONTAINER_NAME, TRIAL_ENV, Answer, Batch, Outcome

pytestmark = pytest.mark.integration


def _one_pool(name: str, **budget: int) -> dict[str, Any]:
    doc = example(name, **budget)
    doc["spec"]["targets"] = [t for t in doc["spec"]["targets"] if t["name"] == "a100"]
    doc["spec"]["strategy"] = {"name": "random", "seed": 11}
    return doc


def _assert_once_each(records: list[TrialRecord], budget: int) -> None:
    ids = Counter(r.index for r in records)
    assert max(ids.values()) == 1, f"recorded twice: {[i for i, n in ids.items() if n > 1]}"
    observed = [r for r in records if r.is_observation]
    assert len(observed) == budget, (len(observed), budget)
    keys = Counter(r.key for r in observed)
    assert max(keys.values()) == 1, "a configuration was measured twice"
    assert not [r for r in records if r.outcome.is_invalid_configuration], "nothing here is invalid"
    for rec in observed:  # each time is the one its Pod reported for its configuration
        assert rec.objective == ok_time(rec.config), rec


def _entries(pod: dict[str, Any]) -> int:
    """How many configurations a trial Pod measures (every trial Pod carries the batch label:
    the default configuration's Pod, alone, is a batch of one)."""
    container = next(c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_NAME)
    return len(Batch.from_env(next(e["value"] for e in container["env"] if e["name"] == TRIAL_ENV)).entries)


def _assert_clean_log(operator: OperatorProcess) -> None:
    found = tracebacks(operator.logs())
    assert not found, "the operator logged tracebacks:\n" + "\n---\n".join(found[:3])


def test_a_batch_pod_killed_half_way_keeps_its_answers_and_retries_the_rest(cluster, namespace, operator):
    victim: list[Batch] = []

    def policy(work: Any, pod: dict[str, Any]) -> Reply:
        if not isinstance(work, Batch):
            return ok_reply(work)  # the default configuration, alone, and the ramp's first single ones
        if not victim and len(work.entries) >= 3:
            # Killed (out of memory, say) after two answers: the kubelet reads the
            # termination log the job rewrote after each of them.
            victim.append(work)
            return Reply(batch_message(ok_answers(work, 2), done=False, error="terminated by SIGKILL"),
                         KILLED_EXIT_CODE, 1.0)
        return ok_batch_reply(work)

    budget = 9
    with PodCompleter(cluster, namespace, policy) as completer:
        assert apply(cluster, namespace, _one_pool("halfway", trialsPerTarget=budget, parallelism=1,
                                                   trialsPerPod=4)).returncode == 0
        run = wait_phase(cluster, namespace, "halfway", 240, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = {r.index: r for r in stored_records(cluster, namespace, "halfway")}
    first, second, *rest = [e.index for e in victim[0].entries]
    assert records[first].outcome == records[second].outcome == Outcome.OK  # finished before the kill
    for index in rest:
        assert records[index].outcome == Outcome.INFRA_ERROR and "not measured" in records[index].error
    _assert_once_each(list(records.values()), budget)
    target = run["status"]["targets"][0]
    assert target["invalid"] == 0 and target["infraFailed"] == len(rest)
    for seen in completer.pods.values():
        assert_restricted(seen)
    _assert_clean_log(operator)


BAD = ("oversized", "truncated", "foreign index", "duplicate")


def test_garbled_batch_results_lose_nothing_and_count_nothing_twice(cluster, namespace, operator):
    sent: dict[str, Batch] = {}

    def policy(work: Any, pod: dict[str, Any]) -> Reply:
        if not isinstance(work, Batch):
            return ok_reply(work)
        if len(sent) < len(BAD) and len(work.entries) >= 2:
            kind = BAD[len(sent)]
            sent[kind] = work
            return Reply(bad_batch_message(work, kind), 0)  # type: ignore[arg-type]
        return ok_batch_reply(work)

    budget = 14
    with PodCompleter(cluster, namespace, policy) as completer:
        assert apply(cluster, namespace, _one_pool("garbled-batch", trialsPerTarget=budget, parallelism=2,
                                                   trialsPerPod=3, maxInfraFailures=5)).returncode == 0
        run = wait_phase(cluster, namespace, "garbled-batch", 300, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = {r.index: r for r in stored_records(cluster, namespace, "garbled-batch")}
    for kind in ("oversized", "truncated"):  # unreadable: every entry is tried again, none is invalid
        for e in sent[kind].entries:
            assert records[e.index].outcome == Outcome.INFRA_ERROR, (kind, records[e.index])
    for kind in ("foreign index", "duplicate"):  # readable: the batch's own answers, the first of each
        for e in sent[kind].entries:
            assert records[e.index].outcome == Outcome.OK, (kind, records[e.index])
    stray = max(e.index for e in sent["foreign index"].entries) + 1000
    assert stray not in records  # no record made up for an index that was not in the batch
    _assert_once_each(list(records.values()), budget)
    lost = len(sent["oversized"].entries) + len(sent["truncated"].entries)
    assert run["status"]["targets"][0]["infraFailed"] == lost
    for seen in completer.pods.values():
        assert_restricted(seen)
    _assert_clean_log(operator)


def test_a_run_on_the_simulator_measures_in_batches_with_fewer_pods(cluster, namespace, simulator, operator):
    budget = 24
    doc = _one_pool("batched", trialsPerTarget=budget, parallelism=2, trialsPerPod=8)
    assert apply(cluster, namespace, doc).returncode == 0
    run = wait_phase(cluster, namespace, "batched", 240, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = stored_records(cluster, namespace, "batched")
    observed = [r for r in records if r.is_observation]
    assert len(observed) == budget and len({r.index for r in records}) == len(records)
    pods = {r.job for r in records}
    assert len(pods) <= 1 + math.ceil((budget - 1) / 8) + 2, pods  # the default alone, then batches of 8
    assert all(r.run_s is not None for r in observed if r.outcome == Outcome.OK)  # GPU time per configuration
    per_pod = Counter(r.job for r in records)
    # Random search learns nothing from results, so its Pods take 8 from the start (no
    # ramp); the end of the budget is spread thinner over the free Pods.
    assert max(per_pod.values()) == 8 and min(per_pod.values()) >= 1, per_pod
    target = get_run(cluster, namespace, "batched")["status"]["targets"][0]
    assert target["trialsPerPod"] == 8 and target["completed"] == budget  # the size the Pods aim at


def test_a_batch_pod_deleted_mid_batch_keeps_the_answers_it_wrote(cluster, namespace, simulator, operator):
    """Evicted, preempted or drained: the kubelet stops the container, the job writes what
    it finished, the Pod ends and is removed. The operator reads those answers from the
    Pod's last state, after the Pod is gone (the simulator plays the kubelet)."""
    budget, size = 40, 32
    doc = _one_pool("evicted", trialsPerTarget=budget, parallelism=1, trialsPerPod=size, maxInfraFailures=3)
    assert apply(cluster, namespace, doc).returncode == 0
    selector = f"{BATCH_LABEL}=true,{RUN_LABEL}=evicted"

    def running_batch_pod() -> dict[str, Any] | None:
        out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
        for pod in json.loads(out)["items"]:
            started = [s for s in pod["status"].get("containerStatuses") or [] if (s.get("state") or {}).get("running")]
            if pod["status"].get("phase") == "Running" and started and _entries(pod) > 1:
                return pod  # type: ignore[no-any-return]
        return None

    pod = wait_for(running_batch_pod, 120, "a running batch Pod", interval=0.2)
    time.sleep(1.0)  # a few of its configurations answered (the simulator's clock: 0.3 x recorded)
    job = pod["metadata"]["labels"]["batch.kubernetes.io/job-name"]
    cluster.kubectl("delete", "pod", "-n", namespace, pod["metadata"]["name"], "--wait=false")
    run = wait_phase(cluster, namespace, "evicted", 240, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = stored_records(cluster, namespace, "evicted")
    mine = [r for r in records if r.job == job]
    answered = [r for r in mine if r.outcome != Outcome.INFRA_ERROR]
    lost = [r for r in mine if r.outcome == Outcome.INFRA_ERROR]
    assert len(mine) == size, mine
    assert answered, "the answers the Pod wrote before it was deleted were lost"
    assert lost and all("not measured" in r.error for r in lost)  # the rest: tried again, never invalid
    assert len([r for r in records if r.is_observation]) == budget
    assert len({r.index for r in records}) == len(records)
    _assert_clean_log(operator)


def test_a_running_batch_pods_answers_reach_the_status_before_it_ends(cluster, namespace, operator):
    """The operator reads a running batch Pod's answers from its log (kwok serves the lines
    the simulator prints, through the real apiserver's pods/log, under the chart's RBAC):
    the status counts them while the Pod still runs, and each is stored once, from the
    termination message, when it ends."""
    budget, size = 17, 16  # the default alone, then one Pod of 16 (random search: no ramp)
    doc = _one_pool("streamed", trialsPerTarget=budget, parallelism=1, trialsPerPod=size)
    selector = f"{BATCH_LABEL}=true,{RUN_LABEL}=streamed"
    # The simulator at a quarter of the GPU's pace: a Pod of 16 convolution configurations,
    # compiled 8 at a time, runs ~15 s, longer than the status may lag behind (5 s).
    with FleetSimulator(cluster.kubeconfig, cluster.fleet, time_scale=4.0):
        assert apply(cluster, namespace, doc).returncode == 0

        def running_batch() -> dict[str, Any] | None:
            out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
            return next((p for p in json.loads(out)["items"]
                         if p["status"].get("phase") == "Running" and _entries(p) > 1), None)

        pod = wait_for(running_batch, 120, "a running batch Pod", interval=0.2)
        before = 1  # the default configuration's Pod, ended before this one started
        name = pod["metadata"]["name"]

        def counted_while_running() -> int | None:
            now = json.loads(cluster.kubectl("get", "pod", "-n", namespace, name, "-o", "json").stdout)
            assert now["status"].get("phase") == "Running", "the Pod ended before its answers were counted"
            target = get_run(cluster, namespace, "streamed")["status"]["targets"][0]
            return int(target["completed"]) if int(target["completed"]) > before else None

        counted = wait_for(counted_while_running, 30, "answers counted while the Pod runs", interval=0.3)
        logs = cluster.kubectl("logs", "-n", namespace, name, "-c", CONTAINER_NAME).stdout
        printed = [a for line in logs.splitlines() if (a := Answer.from_line(line)) is not None]
        assert printed and counted - before <= len(printed), (counted, before, logs[:500])
        run = wait_phase(cluster, namespace, "streamed", 120, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = stored_records(cluster, namespace, "streamed")
    assert len({r.index for r in records}) == len(records) and sum(r.is_observation for r in records) == budget
    mine = {r.index: r for r in records if r.job == pod["metadata"]["labels"]["batch.kubernetes.io/job-name"]}
    assert len(mine) == size
    for answer in printed:  # what the log said is what was stored
        assert mine[answer.i].outcome == answer.o and mine[answer.i].objective == answer.t
    assert run["status"]["targets"][0]["completed"] == budget
    _assert_clean_log(operator)
