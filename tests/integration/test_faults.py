"""Faults on the real control plane: operator and apiserver crashes, lost nodes, evictions,
garbled results, pools without nodes, runs deleted mid-flight.

Every test ends with an audit: the results store against the trials that really ran (no
loss, no double count), the Jobs ever created (none twice), the operator alive and
without tracebacks where none are expected, trial Pods restricted, and no credential in a
log, an event or the status.
"""

from __future__ import annotations

import calendar
import json
import time
import warnings
from collections import Counter
from typing import Any

import pytest
from fault_support import (
    JobLedger,
    PodCompleter,
    Reply,
    add_nodes,
    assert_no_secrets,
    assert_restricted,
    delete_nodes,
    ok_reply,
    operator_cpu_seconds,
    stopped_reply,
    tracebacks,
)
from operator_support import (
    OperatorProcess,
    apply,
    example,
    get_run,
    jobs,
    stored_records,
    wait_for,
    wait_phase,
)

from fleettune.jobs import STALL_GRACE_S, STARTUP_ALLOWANCE_S
from fleettune.results import TrialRecord
from fleettune_job.protocol import Outcome, Trial, TrialResult

pytestmark = pytest.mark.integration

ALL_POOLS = ["a100", "rtx-a4000", "jetson-orin"]




# When the operator runs a stalled trial Job's configuration again: its deadline (a batch of
# one: its configuration's timeout and one more for a fresh worker, `jobs.render_job`) and the grace.
_STALLED_AFTER = 2 * example("x")["spec"]["budget"]["trialTimeoutSeconds"] + STARTUP_ALLOWANCE_S + STALL_GRACE_S


def _one_pool(name: str, target: str = "a100", **budget: int) -> dict[str, Any]:
    """The example on one pool, random strategy (no model fits to wait for), no Jetson image,
    one configuration per Pod, a batch of one (the faults of one trial; a larger batch's:
    test_batch_faults.py)."""
    doc = example(name, **{"trialsPerPod": 1, **budget})
    doc["spec"]["targets"] = [t for t in doc["spec"]["targets"] if t["name"] == target]
    doc["spec"]["strategy"] = {"name": "random", "seed": 3}
    return doc


def _where_it_stopped(cluster, namespace: str, run: str) -> str:
    """The run's Jobs, Pods and last events, for a test that timed out waiting for it."""
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    return "; ".join([
        *(f"Job {j['metadata']['name']} {j.get('status')}" for j in jobs(cluster, namespace, run)),
        *(f"Pod {q['metadata']['name']} {q['status'].get('phase')} on {q['spec'].get('nodeName')} "
          f"deleting={bool(q['metadata'].get('deletionTimestamp'))} finalizers={q['metadata'].get('finalizers')} "
          f"conditions={[(c['type'], c.get('reason'), c.get('message')) for c in q['status'].get('conditions') or []]}"
          for q in pods),
        "events: " + " | ".join(_events(cluster, namespace).splitlines()[-12:]),
    ])


def _events(cluster, namespace: str) -> str:
    out = cluster.kubectl("get", "events", "-n", namespace, "-o", "json")
    return "\n".join(f"{e.get('reason')}: {e.get('message')}" for e in json.loads(out.stdout)["items"])


def _audit(records: list[TrialRecord], answered: set[tuple[str, int]], budget: int, targets: list[str],
           unsettled: frozenset[tuple[str, int]] = frozenset()) -> None:
    """No trial recorded twice, every trial that ran recorded, every observation really ran
    (or may have: ``unsettled``, a result whose write was stored by an apiserver that died
    before replying, and whose Pod was deleted before the simulator could read it back)."""
    ids = Counter((r.target, r.index) for r in records)
    assert not [k for k, n in ids.items() if n > 1], f"recorded twice: {[k for k, n in ids.items() if n > 1]}"
    recorded = set(ids)
    assert answered <= recorded, f"trials that ran but have no record: {sorted(answered - recorded)}"
    observed = {(r.target, r.index) for r in records if r.is_observation}
    never = observed - answered - unsettled
    assert not never, f"observations of trials that never ran: {sorted(never)}"
    for target in targets:
        obs = [r for r in records if r.target == target and r.is_observation]
        assert len(obs) == budget, (target, len(obs), budget)
        keys = Counter(r.key for r in obs)
        assert max(keys.values()) == 1, f"{target}: a configuration was evaluated twice"


def _assert_clean_log(operator: OperatorProcess) -> None:
    found = tracebacks(operator.logs())
    assert not found, "the operator logged tracebacks:\n" + "\n---\n".join(found[:3])


# ---------------------------------------------------------------------------- crashes


def test_operator_killed_three_times_including_during_a_job_burst(cluster, namespace, simulator, operator):
    """SIGKILL while the first burst of Jobs is being created, mid-run, and right after a restart."""
    budget, parallelism = 12, 6
    doc = example("kills", trialsPerTarget=budget, parallelism=parallelism)
    with JobLedger(cluster, namespace, poll_s=0.05) as ledger:
        assert apply(cluster, namespace, doc).returncode == 0
        # 1. During the opening burst: some of the 18 Jobs exist, not all.
        wait_for(lambda: ledger.total >= 1, 120, "the first Job", interval=0.02)
        operator.kill()
        burst = ledger.total
        time.sleep(1)
        operator.start()
        # 2. Mid-run, while records are being written and Jobs deleted.
        wait_for(lambda: len(stored_records(cluster, namespace, "kills")) >= 10, 240, "10 records")
        operator.kill()
        before = {(r.target, r.index) for r in stored_records(cluster, namespace, "kills")}
        time.sleep(2)  # trials keep finishing while no operator runs
        operator.start()
        # 3. While the new instance is still loading the store and adopting Jobs.
        time.sleep(2.5)
        operator.kill()
        operator.start()
        run = wait_phase(cluster, namespace, "kills", 420, operator)
        time.sleep(0.5)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    # The first kill comes as soon as a poll sees a Job of the opening burst. The operator
    # creates the burst's Jobs concurrently, so one poll may already see all of them: the kill
    # then lands right after the burst, before the operator has recorded anything of it,
    # which the adoption below must survive just the same.
    assert 1 <= burst <= 3 * parallelism, f"the first kill came after more than the opening burst ({burst} Jobs)"
    assert not ledger.recreated(), f"Jobs created twice under the same name: {ledger.recreated()}"

    records = stored_records(cluster, namespace, "kills")
    assert before <= {(r.target, r.index) for r in records}, "a recorded result was lost"
    answered = [(t, i) for (ns, rn, t, i) in simulator.answered if ns == namespace and rn == "kills"]
    dupes = [k for k, n in Counter(answered).items() if n > 1]
    assert not dupes, f"trials that ran twice: {dupes}"
    _audit(records, set(answered), budget, ALL_POOLS)
    # Every trial of every Job ever created (one, or a batch) is accounted for by one record.
    made = Counter(trial for trials in ledger.trials.values() for trial in trials)
    assert max(made.values()) == 1, "a trial index was given to two Jobs"
    assert set(made) == {(r.target, r.index) for r in records}
    assert run["status"]["trials"]["completed"] == 3 * budget
    # The last Jobs are recorded from their Pods' ends, and deleted once the Job controller
    # has marked them done, which may come a moment after the run's phase.
    wait_for(lambda: not jobs(cluster, namespace, "kills"), 30, "the finished run's Jobs to be deleted")

    assert_no_secrets({"operator log": operator.logs(), "events": _events(cluster, namespace),
                       "status": json.dumps(run["status"])}, cluster.kubeconfig, operator.kubeconfig)


def test_apiserver_and_etcd_crash_mid_run_and_the_run_finishes(cluster, namespace, simulator, operator):
    budget = 10
    assert apply(cluster, namespace, example("outage", trialsPerTarget=budget, parallelism=3)).returncode == 0
    wait_for(lambda: len(stored_records(cluster, namespace, "outage")) >= 6, 240, "6 records")
    before = {(r.target, r.index) for r in stored_records(cluster, namespace, "outage")}
    cluster.restart_apiserver(with_etcd=True, crash=True)
    assert all(cluster.running().values()), cluster.running()
    run = wait_phase(cluster, namespace, "outage", 420, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = stored_records(cluster, namespace, "outage")
    assert before <= {(r.target, r.index) for r in records}
    answered = {(t, i) for (ns, rn, t, i) in simulator.answered if ns == namespace and rn == "outage"}
    unsettled = frozenset((t, i) for (ns, rn, t, i) in simulator.unsettled if ns == namespace and rn == "outage")
    _audit(records, answered, budget, ALL_POOLS, unsettled)
    # The watches came back: the run finished through events, not only through polling —
    # a Job finishing after the restart was seen within seconds (the idle wake-up is 5 s).
    assert operator.proc is not None and operator.proc.poll() is None


# ---------------------------------------------------------------------------- lost pods


def test_evicted_trial_pod_is_retried_not_recorded_as_infeasible(cluster, namespace, operator):
    from kubernetes import client

    victim_index = 2
    pods_of: Counter[str] = Counter()  # by configuration: a stalled Job's is measured again in another Job
    victim: list[str] = []

    def policy(trial: Trial, pod: dict[str, Any]) -> Reply | None:
        key = json.dumps(trial.config, sort_keys=True)
        pods_of[key] += 1
        if trial.index == victim_index and pods_of[key] == 1:
            victim.append(key)
            return None  # keeps running until evicted
        return ok_reply(trial)

    with PodCompleter(cluster, namespace, policy) as completer:
        assert apply(cluster, namespace, _one_pool("evict", trialsPerTarget=5, parallelism=2)).returncode == 0
        pod, _, _ = completer.wait_running(lambda t: t.index == victim_index, 120)
        with cluster.api_client() as api:
            client.CoreV1Api(api).create_namespaced_pod_eviction(
                pod, namespace, {"apiVersion": "policy/v1", "kind": "Eviction",
                                 "metadata": {"name": pod, "namespace": namespace}})
        # The evicted Pod ends disrupted (DisruptionTarget): its Job's pod failure policy ignores
        # that end, and the Job controller starts another Pod within seconds. In a few full runs
        # on a loaded machine it did not (it waits for a Pod event it never sees:
        # `jobs.STALL_GRACE_S`); the operator then runs the trial again in a new Job once the
        # stalled one is past its deadline (360 s) and the grace.
        try:
            run = wait_phase(cluster, namespace, "evict", _STALLED_AFTER + 120, operator)
        except AssertionError as exc:
            where = _where_it_stopped(cluster, namespace, "evict")
            raise AssertionError(f"{exc}; Pods per configuration {dict(pods_of)}, "
                                 f"completer errors {completer.errors[-3:]}; {where}") from None
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert pods_of[victim[0]] == 2, "the evicted trial ran again in a new Pod"
    records = stored_records(cluster, namespace, "evict")
    (again,) = [r for r in records if json.dumps(r.config, sort_keys=True) == victim[0]]
    assert again.outcome == Outcome.OK, f"the evicted trial was recorded as {again.outcome}: {again.error}"
    assert not [r for r in records if r.outcome.is_invalid_configuration]
    assert run["status"]["targets"][0]["invalid"] == 0
    if again.index != victim_index:  # the rare path: say it was taken
        stalled = [line for line in _events(cluster, namespace).splitlines() if line.startswith("TrialJobStalled:")]
        assert stalled, "the trial ran in a new Job with no TrialJobStalled event"
        warnings.warn(f"the evicted trial's Job stalled and ran again: {stalled[0]}", stacklevel=1)
    for seen in completer.pods.values():
        assert_restricted(seen)
    _assert_clean_log(operator)


def test_node_deleted_under_a_running_trial_is_retried_elsewhere(cluster, namespace, operator):
    victim_index = 1
    pods_of: Counter[str] = Counter()  # by configuration: a stalled Job's is measured again in another Job
    victim: list[str] = []

    def policy(trial: Trial, pod: dict[str, Any]) -> Reply | None:
        key = json.dumps(trial.config, sort_keys=True)
        pods_of[key] += 1
        if trial.index == victim_index and pods_of[key] == 1:
            victim.append(key)
            return ok_reply(trial, delay_s=600)  # would answer late, but its node will be gone
        return ok_reply(trial)

    # Two nodes of the run's own (copies of the A100 pool): deleting one leaves the fleet whole.
    nodes = [f"lost-{namespace[-6:]}-{i}" for i in range(2)]
    add_nodes(cluster, "a100", nodes, {"fleettune.dev/fault-pool": namespace[-6:]})
    try:
        doc = _one_pool("lost", trialsPerTarget=4, parallelism=2)
        doc["spec"]["targets"][0]["nodeSelector"] = {"fleettune.dev/fault-pool": namespace[-6:]}
        with PodCompleter(cluster, namespace, policy) as completer:
            assert apply(cluster, namespace, doc).returncode == 0
            _, _, node = completer.wait_running(lambda t: t.index == victim_index, 120)
            delete_nodes(cluster, [node])
            # Pod garbage collection notices an orphaned Pod after a 40 s quarantine. A Job the
            # Job controller stalls on is run again past its deadline (see the eviction test).
            run = wait_phase(cluster, namespace, "lost", _STALLED_AFTER + 120, operator)
    finally:
        delete_nodes(cluster, nodes)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = stored_records(cluster, namespace, "lost")
    mine = [r for r in records if json.dumps(r.config, sort_keys=True) == victim[0]]
    assert not [r for r in records if r.outcome.is_invalid_configuration], f"lost node recorded as infeasible: {mine}"
    # Retried: by the Job (a new Pod, same trial), or by the operator (infra, then re-run; or
    # a stalled Job's configuration measured again in a new Job).
    assert any(r.outcome == Outcome.OK for r in mine), records
    assert all(r.node != node or r.outcome == Outcome.INFRA_ERROR for r in mine)
    for seen in completer.pods.values():
        assert_restricted(seen)
    _assert_clean_log(operator)


# ---------------------------------------------------------------------------- bad results


def _unknown_version() -> str:
    return json.dumps({"version": 2, "outcome": "ok", "objective": 1.0})


def _oversized() -> str:
    doc = TrialResult(outcome=Outcome.OK, objective=1.0).model_dump(mode="json")
    doc["error"] = "x" * 6000
    return json.dumps(doc)


BAD_MESSAGES = {
    # trial index: (termination message, exit code, text the record must carry)
    1: ('{"version": 1, "outcome": "ok", "objective": ', 0, "not JSON"),
    2: (_oversized(), 0, "exceeds 4 KiB"),
    3: ("", 0, "empty termination message"),
    4: (_unknown_version(), 0, "unknown protocol version 2"),
    5: ("compiler crashed before writing a result", 10, "not JSON"),  # exit code says invalid, text is garbage
    6: ('["ok"]', 0, "not a JSON object"),
}


def test_garbled_termination_messages_are_infra_failures_with_their_text(cluster, namespace, operator):
    def policy(trial: Trial, pod: dict[str, Any]) -> Reply | None:
        if trial.index in BAD_MESSAGES:
            message, code, _ = BAD_MESSAGES[trial.index]
            return Reply(message, code)
        return ok_reply(trial)

    budget = 6
    doc = _one_pool("garbled", trialsPerTarget=budget, parallelism=2)
    with PodCompleter(cluster, namespace, policy) as completer:
        assert apply(cluster, namespace, doc).returncode == 0
        run = wait_phase(cluster, namespace, "garbled", 240, operator)
    assert not completer.errors or all("Conflict" in e for e in completer.errors), completer.errors
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = {r.index: r for r in stored_records(cluster, namespace, "garbled")}
    for index, (_, _, text) in BAD_MESSAGES.items():
        rec = records[index]
        assert rec.outcome == Outcome.INFRA_ERROR, (index, rec)
        assert not rec.is_observation
        assert text in rec.error, (index, rec.error)
    target = run["status"]["targets"][0]
    assert target["infraFailed"] == len(BAD_MESSAGES)
    assert target["completed"] == budget and target["invalid"] == 0
    assert sum(r.is_observation for r in records.values()) == budget
    for seen in completer.pods.values():
        assert_restricted(seen)
    _assert_clean_log(operator)
    assert_no_secrets({"operator log": operator.logs(), "events": _events(cluster, namespace),
                       "status": json.dumps(run["status"])}, cluster.kubeconfig, operator.kubeconfig)


# ---------------------------------------------------------------------------- pools


def test_pool_without_nodes_gets_a_condition_no_busy_loop_and_others_finish(cluster, namespace, simulator,
                                                                           operator):
    ghost = f"ghost-{namespace[-6:]}"
    doc = example("ghost", trialsPerTarget=3, parallelism=2)
    doc["spec"]["strategy"] = {"name": "random", "seed": 5}
    doc["spec"]["targets"] = [
        doc["spec"]["targets"][0],
        {"name": "ghost", "nodeSelector": {"fleettune.dev/ghost": ghost}},
    ]
    with JobLedger(cluster, namespace) as ledger:
        assert apply(cluster, namespace, doc).returncode == 0

        def a100_done() -> dict[str, Any] | None:
            run = get_run(cluster, namespace, "ghost")
            targets = {t["name"]: t for t in (run.get("status") or {}).get("targets", [])}
            return run if targets.get("a100", {}).get("phase") == "Succeeded" else None

        run = wait_for(a100_done, 240, "the a100 pool to finish")
        targets = {t["name"]: t for t in run["status"]["targets"]}
        assert targets["ghost"]["phase"] == "Unschedulable"
        assert "spec.targets[ghost].nodeSelector" in targets["ghost"]["message"]
        conditions = {c["type"]: c for c in run["status"]["conditions"]}
        assert conditions["Degraded"]["status"] == "True"
        assert "fleettune.dev/ghost" in conditions["Degraded"]["message"]
        assert run["status"]["phase"] == "Running"

        # No busy loop: the operator idles, and the run object is not rewritten in a loop.
        assert operator.proc is not None
        cpu0, rv0 = operator_cpu_seconds(operator.proc.pid), run["metadata"]["resourceVersion"]
        time.sleep(8)
        cpu = operator_cpu_seconds(operator.proc.pid) - cpu0
        assert cpu < 0.8, f"the operator used {cpu:.1f} s of CPU in 8 s while waiting for nodes"
        assert get_run(cluster, namespace, "ghost")["metadata"]["resourceVersion"] == rv0, "status churn"
        assert not [lbl for lbl in ledger.labels.values() if lbl.get("fleettune.dev/target") == "ghost"]

        # A node that appears later is picked up, and the run finishes.
        node = f"ghost-{namespace[-6:]}"
        add_nodes(cluster, "a100", [node], {"fleettune.dev/ghost": ghost})
        try:
            run = wait_phase(cluster, namespace, "ghost", 180, operator)
        finally:
            delete_nodes(cluster, [node])
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert {t["name"]: t["completed"] for t in run["status"]["targets"]} == {"a100": 3, "ghost": 3}
    _assert_clean_log(operator)


def test_a_pool_scaled_to_zero_withdraws_its_pending_trial_when_no_node_comes(cluster, crd, namespace, tmp_path):
    """The trial kept pending for an autoscaler is deleted when the wait ends, with no record:
    the autoscaler stops being asked for a node, and the configuration is not lost."""
    from operator_support import ChartIdentity

    identity = ChartIdentity(cluster, namespace, tmp_path)
    # The wait counts from the operator's first look at the pool, before its search is built
    # (seconds of CPU on a loaded machine): long enough for the status to show it.
    operator = OperatorProcess(identity.kubeconfig, namespace, tmp_path, env={"FLEETTUNE_NODE_WAIT_SECONDS": "20"})
    operator.start()
    doc = example("zero", trialsPerTarget=3, parallelism=2)
    doc["spec"]["targets"] = [{"name": "h", "nodeSelector": {
        "nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB", "fleettune.dev/ghost": f"zero-{namespace[-6:]}"}}]
    try:
        with JobLedger(cluster, namespace) as ledger:
            assert apply(cluster, namespace, doc).returncode == 0

            def waiting() -> dict[str, Any] | None:
                targets = (get_run(cluster, namespace, "zero").get("status") or {}).get("targets") or []
                return targets[0] if targets and "kept pending" in targets[0].get("message", "") else None

            assert "cluster autoscaler" in wait_for(waiting, 60, "the pool to keep a trial pending")["message"]
            wait_for(lambda: jobs(cluster, namespace, "zero") or None, 30, "the pending trial Job")

            def withdrawn() -> dict[str, Any] | None:
                targets = (get_run(cluster, namespace, "zero").get("status") or {}).get("targets") or []
                t = targets[0] if targets else {}
                return t if t.get("phase") == "Unschedulable" and not jobs(cluster, namespace, "zero") else None

            target = wait_for(withdrawn, 60, "the pool to say Unschedulable and withdraw its Job")
            time.sleep(3)  # and start none again
            assert not jobs(cluster, namespace, "zero")
        assert len(ledger.uids) == 1, ledger.uids
        # Said at once ("1 waiting trial Job(s) withdrawn, …") and on every later step.
        # The pending Pod held the pool's first picks, the whole budget of 3: all back.
        assert "3 configuration(s) back in the queue, none counted as failed" in target["message"]
        assert "Withdrawn: h: no node matches" in _events(cluster, namespace)
        assert not stored_records(cluster, namespace, "zero")
        assert target["completed"] == 0 and target.get("infraFailed", 0) == 0 and target.get("invalid", 0) == 0
    finally:
        operator.stop()
        identity.remove()
    _assert_clean_log(operator)


# ---------------------------------------------------------------------------- deletion


def test_run_deleted_while_jobs_run_leaves_nothing_behind(cluster, namespace, operator):
    from kubernetes import client

    answered: set[str] = set()

    def policy(trial: Trial, pod: dict[str, Any]) -> Reply | None:
        # One quick result per pool (so there is a results shard), then trials that never end.
        # The first to start, whichever it is: a pool's Jobs are created at once, and the
        # Jetson pool has only two GPUs for its three.
        if trial.target in answered:
            return None
        answered.add(trial.target)
        return ok_reply(trial)

    doc = example("doomed", trialsPerTarget=50, parallelism=3, trialsPerPod=1)
    doc["spec"]["strategy"] = {"name": "random", "seed": 7}
    with JobLedger(cluster, namespace) as ledger, PodCompleter(cluster, namespace, policy) as completer:
        assert apply(cluster, namespace, doc).returncode == 0
        wait_for(lambda: len(stored_records(cluster, namespace, "doomed")) >= 3, 120, "a record per pool")
        wait_for(lambda: len(completer.running) >= 6, 120, "trials running on every pool")
        deleted_at = time.time()
        cluster.kubectl("delete", "-n", namespace, "tuningrun", "doomed", "--wait=true", "--timeout=90s")
        selector = "fleettune.dev/run=doomed"

        def leftovers() -> dict[str, int]:
            with cluster.api_client() as api:
                core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
                return {
                    "jobs": len(batch.list_namespaced_job(namespace, label_selector=selector).items),
                    "pods": len(core.list_namespaced_pod(namespace, label_selector=selector).items),
                    "results": len(core.list_namespaced_config_map(
                        namespace, label_selector="fleettune.dev/results-of=doomed").items),
                }

        wait_for(lambda: not any(leftovers().values()), 120, "the run's Jobs, Pods and results to go")
        time.sleep(6)  # longer than the operator's idle wake-up: would it recreate anything?
        assert not any(left := leftovers().values()), left
    late = [uid for uid, ts in ledger.created.items()
            if calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")) > deleted_at + 1]
    assert not late, f"{len(late)} Jobs created after the run was deleted"
    assert operator.proc is not None and operator.proc.poll() is None
    for seen in completer.pods.values():
        assert_restricted(seen)
    _assert_clean_log(operator)


def test_a_pool_failed_by_infrastructure_says_the_last_cause_in_its_condition(cluster, namespace, operator):
    """The cause used to be in the operator's log alone ("11 infrastructure failures")."""
    cause = "CUDA driver version is insufficient for CUDA runtime version (node gpu-7)"

    def policy(trial: Trial, pod: dict[str, Any]) -> Reply | None:
        return stopped_reply(cause)  # the job could not start its GPU worker

    doc = _one_pool("infra", trialsPerTarget=4, parallelism=1, maxInfraFailures=1)
    with PodCompleter(cluster, namespace, policy):
        assert apply(cluster, namespace, doc).returncode == 0
        run = wait_phase(cluster, namespace, "infra", 180, operator)
    assert run["status"]["phase"] == "Failed"
    target = run["status"]["targets"][0]
    lost = f"not measured: the batch ended before this configuration ({cause})"
    assert target["message"] == f"2 infrastructure failures (budget.maxInfraFailures=1); the last: {lost}"
    ready = next(c for c in run["status"]["conditions"] if c["type"] == "Ready")
    assert cause in ready["message"]
    said = _events(cluster, namespace)
    assert f"InfraFailure: a100: trial lost to the infrastructure: {lost}" in said, said
    # Both trials lost to the same cause: one Event, counted twice, as Kubernetes' recorder does.
    items = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    assert [e.get("count") for e in items if e.get("reason") == "InfraFailure"] == [2], said
    assert "TargetFailed: a100: 2 infrastructure failures" in said, said
