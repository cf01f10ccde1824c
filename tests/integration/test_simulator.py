"""The fleet simulator completes trial Pods through the real Job machinery (Jobs shaped as
`fleettune.jobs.render_job` shapes them: a batch, here of one configuration)."""

from __future__ import annotations

import gzip
import json
import time
import uuid
from functools import partial

import operator_support
import pytest
from kubernetes import client

from fleettune.labels import POOL_LABEL
from fleettune_dev.cluster.fleet import packaged_recordings_dir
from fleettune_job import nvrtc
from fleettune_job.protocol import (
    EXIT_STOPPED_EARLY,
    TRIAL_ENV,
    Batch,
    BatchResult,
    KernelRef,
    Outcome,
    TrialResult,
    decode_batch,
)

pytestmark = pytest.mark.integration

EDGE_TOLERATION = {"key": "edge", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


# Services and Pods answer in well under a second here: poll faster than the operator tests do.
wait_for = partial(operator_support.wait_for, interval=0.2)


@pytest.fixture(scope="module")
def a100_recording() -> dict:
    return json.loads(gzip.decompress((packaged_recordings_dir() / "convolution_milo-A100.json.gz").read_bytes()))


def _config(rec: dict, key: str) -> dict:
    return dict(zip(rec["tune_params_keys"], (int(v) for v in key.split(",")), strict=True))


def _one(pool: str, config: dict, kernel: dict | None = None, problem_size: list[int] | None = None) -> str:
    """The work of a Pod measuring one configuration: a batch of one, trial index 0."""
    return Batch(run="sim-test", target=pool, kernel=KernelRef.model_validate(kernel or {"builtin": "convolution"}),
                 problem_size=problem_size or [4096, 4096], entries=[{"index": 0, "config": config}]).to_env()


def _trial_job(name: str, pool: str, config: dict | None, *, trial_env: str | None = None,
               tolerations: list | None = None) -> dict:
    env = trial_env if trial_env is not None else _one(pool, config or {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "fleettune"}},
        "spec": {
            # As the operator's: never retried, but a disruption is no failure.
            "backoffLimit": 0,
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/managed-by": "fleettune"}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {POOL_LABEL: pool},
                    "tolerations": tolerations or [],
                    "containers": [{
                        "name": "trial", "image": "example.invalid/fleettune-job:1",
                        "env": [{"name": TRIAL_ENV, "value": env}],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }],
                },
            },
        },
    }


def _finished(batch: client.BatchV1Api, namespace: str, name: str):
    job = batch.read_namespaced_job(name, namespace)
    for c in job.status.conditions or []:
        if c.type in ("Complete", "Failed") and c.status == "True":
            return c
    return None


def _terminated(core: client.CoreV1Api, namespace: str, job: str) -> list:
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    return [s.state.terminated for p in pods for s in p.status.container_statuses or []
            if s.name == "trial" and s.state.terminated]


def _answer(message: str) -> tuple[TrialResult, BatchResult]:
    """The one configuration's result in a Pod's termination message, and the whole message."""
    batch = decode_batch(message)
    (answer,) = batch.answers
    return answer.result(batch.fingerprint), batch


def test_trial_job_completes_with_the_recorded_result(cluster, api_client, namespace, simulator, a100_recording):
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    key, entry = min(((k, e) for k, e in a100_recording["cache"].items() if not isinstance(e["time"], str)),
                     key=lambda ke: ke[1]["time"])
    batch.create_namespaced_job(namespace, _trial_job("best", "a100", _config(a100_recording, key)))
    cond = wait_for(lambda: _finished(batch, namespace, "best"), 60, "the job to finish")
    assert cond.type == "Complete"
    [term] = _terminated(core, namespace, "best")
    assert term.exit_code == 0 and term.reason == "Completed"
    result, whole = _answer(term.message)
    assert whole.done and result.outcome == Outcome.OK
    assert result.objective == pytest.approx(entry["time"])
    assert result.times and all(t in entry["times"] for t in result.times)
    fp = result.fingerprint
    assert (fp.product, fp.compute_capability, fp.simulated, fp.synthetic) == (
        "NVIDIA A100-PCIE-40GB", "8.0", True, False)
    assert fp.driver_version == cluster.fleet.pool("a100").gpu.driver_version
    assert (namespace, "sim-test", "a100", 0) in simulator.answered


def test_a_recorded_failure_is_answered_at_once_and_never_retried(api_client, namespace, simulator,
                                                                  a100_recording):
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    key = next(k for k, e in a100_recording["cache"].items() if e["time"] == "RuntimeFailedConfig")
    batch.create_namespaced_job(namespace, _trial_job("broken", "a100", _config(a100_recording, key)))
    cond = wait_for(lambda: _finished(batch, namespace, "broken"), 60, "the job to finish")
    # An invalid configuration is an answer: the Pod ends as answered, the Job is done.
    assert cond.type == "Complete"
    terms = _terminated(core, namespace, "broken")
    assert len(terms) == 1, "no retry for an invalid configuration"
    assert terms[0].exit_code == 0
    result, _ = _answer(terms[0].message)
    assert result.outcome == Outcome.LAUNCH_ERROR and "RuntimeFailedConfig" in result.error


def test_a_pod_that_cannot_read_its_batch_answers_nothing_and_is_not_retried(api_client, namespace, simulator):
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    batch.create_namespaced_job(namespace, _trial_job("garbled", "rtx-a4000", None, trial_env="{not json"))
    cond = wait_for(lambda: _finished(batch, namespace, "garbled"), 90, "the job to give up")
    assert (cond.type, cond.reason) == ("Failed", "BackoffLimitExceeded")
    terms = _terminated(core, namespace, "garbled")
    assert len(terms) == 1 and terms[0].exit_code == EXIT_STOPPED_EARLY
    stopped = decode_batch(terms[0].message)
    assert not stopped.answers and "invalid FLEETTUNE_TRIAL" in stopped.error


def test_jetson_results_are_synthetic(api_client, namespace, simulator, a100_recording):
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    key = next(k for k, e in a100_recording["cache"].items() if not isinstance(e["time"], str))
    batch.create_namespaced_job(namespace, _trial_job("edge", "jetson-orin", _config(a100_recording, key),
                                                      tolerations=[EDGE_TOLERATION]))
    cond = wait_for(lambda: _finished(batch, namespace, "edge"), 60, "the job to finish")
    assert cond.type == "Complete"
    result, _ = _answer(_terminated(core, namespace, "edge")[0].message)
    assert result.fingerprint.synthetic and result.fingerprint.product == "Jetson AGX Orin"


def test_pods_on_real_nodes_are_never_touched(cluster, api_client, namespace, simulator):
    core = client.CoreV1Api(api_client)
    node = f"real-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": node, "labels": {POOL_LABEL: "a100"}}})
    try:
        pod = core.create_namespaced_pod(namespace, {
            "metadata": {"name": "on-real", "labels": {"app.kubernetes.io/managed-by": "fleettune"}},
            "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
                "name": "trial", "image": "example.invalid/x:1",
                "env": [{"name": TRIAL_ENV, "value": _one("a100", {})}]}]},
        })
        # Play a kubelet: the container runs.
        core.patch_namespaced_pod_status("on-real", namespace, {"status": {"phase": "Running",
            "containerStatuses": [{"name": "trial", "image": "example.invalid/x:1", "imageID": "", "ready": True,
                                   "restartCount": 0, "state": {"running": {}}}]}})
        wait_for(lambda: simulator.ignored >= 1, 15, "the simulator to see the pod")
        time.sleep(1.0)
        after = core.read_namespaced_pod("on-real", namespace)
        assert after.status.phase == "Running" and after.metadata.uid == pod.metadata.uid
    finally:
        # No kubelet will ever confirm this pod's deletion: force it.
        core.delete_namespaced_pod("on-real", namespace, grace_period_seconds=0)
        core.delete_node(node)


def test_a_trial_pod_deleted_while_running_is_removed_with_no_answer(cluster, api_client, namespace,
                                                                     a100_recording):
    from fleettune_dev.sim import FleetSimulator

    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    key = next(k for k, e in a100_recording["cache"].items() if not isinstance(e["time"], str))
    # A slow simulator: the trial would take ~90 s, so the deletion lands mid-run.
    with FleetSimulator(cluster.kubeconfig, cluster.fleet, time_scale=100) as slow:
        batch.create_namespaced_job(namespace, _trial_job("cut", "a100", _config(a100_recording, key)))
        wait_for(lambda: slow.pending == 1, 30, "the simulator to start the trial")
        pod = core.list_namespaced_pod(namespace, label_selector="job-name=cut").items[0]
        core.delete_namespaced_pod(pod.metadata.name, namespace)
        # Stopped by the simulator before its first answer (or ended by kwok's pod-delete stage
        # first): the pod goes away at once.
        wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace, label_selector="job-name=cut").items
                              if p.metadata.uid == pod.metadata.uid], 20, "the pod to be removed")
    assert slow.answered == [] and not slow.errors


class _LostReply:
    """A CoreV1Api whose first Pod status write fails as an apiserver that dies mid-request
    does: ``stored`` (it was stored, the reply lost), ``stored_then_deleted`` (and the Pod
    deleted before the simulator's retry: the operator read it and deleted its Job), or
    ``not_stored`` (it never reached etcd)."""

    def __init__(self, core: client.CoreV1Api, fault: str) -> None:
        self.core, self.fault, self.faults = core, fault, 0

    def __getattr__(self, name: str):
        return getattr(self.core, name)

    def patch_namespaced_pod_status(self, name, namespace, body, **kwargs):
        from urllib3.exceptions import ProtocolError

        if self.faults:
            return self.core.patch_namespaced_pod_status(name, namespace, body, **kwargs)
        if self.fault != "not_stored":  # a write the apiserver refuses (409: changed) is no fault
            self.core.patch_namespaced_pod_status(name, namespace, body, **kwargs)
        self.faults += 1
        if self.fault == "stored_then_deleted":
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        raise ProtocolError("Connection broken: IncompleteRead(0 bytes read)")


@pytest.mark.parametrize("fault", ["stored", "stored_then_deleted", "not_stored"])
def test_a_status_write_whose_reply_is_lost_is_answered_once_or_left_unsettled(cluster, api_client, namespace,
                                                                               a100_recording, fault):
    """The fault audits' ground truth: a trial counts as answered exactly when its result
    reached the Pod, and one that cannot be told (its Pod gone) is `unsettled`, not lost."""
    from fleettune_dev.sim import FleetSimulator

    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    key = next(k for k, e in a100_recording["cache"].items() if not isinstance(e["time"], str))
    sim = FleetSimulator(cluster.kubeconfig, cluster.fleet, time_scale=0.05)
    faulty = _LostReply(sim._api(), fault)
    sim._worker_api = lambda: faulty  # type: ignore[method-assign]
    with sim:
        batch.create_namespaced_job(namespace, _trial_job("lost-reply", "a100", _config(a100_recording, key)))
        trial = (namespace, "sim-test", "a100", 0)
        wait_for(lambda: sim.answered or sim.unsettled, 60, "the trial to be settled")
        time.sleep(1.5)  # a second retry, if there were one, would count it again
        assert faulty.faults == 1 and [e for e in sim.errors if "IncompleteRead" in e], sim.errors
        if fault == "stored_then_deleted":
            assert (sim.answered, sim.unsettled) == ([], [trial])
        else:
            assert (sim.answered, sim.unsettled) == ([trial], [])
            [term] = _terminated(core, namespace, "lost-reply")
            assert _answer(term.message)[0].outcome == Outcome.OK


USER_SOURCE = """
extern "C" __global__ void scale(float *x, int n) {
    int i = blockIdx.x * block_size_x * tile + threadIdx.x;
    for (int t = 0; t < tile; t++) {
        if (i + t * block_size_x < n) x[i + t * block_size_x] *= 2.0f;
    }
}
"""


def _user_source_job(name: str, config: dict) -> dict:
    work = _one("a100", config, problem_size=[1 << 20], kernel={
        "source_path": "/etc/fleettune/kernel/scale.cu", "function": "scale",
        "grid": ["cdiv(problem_size[0], block_size_x)"], "block": ["block_size_x"],
        "arguments": [{"name": "x", "length": "problem_size[0]", "output": True},
                      {"name": "n", "kind": "scalar", "dtype": "int32", "value": "problem_size[0]"}],
        "verification": {"reference_config": {"block_size_x": 128, "tile": 1}}})
    job = _trial_job(name, "a100", None, trial_env=work)
    pod = job["spec"]["template"]["spec"]
    # As the operator renders a user-source Job (fleettune.jobs): the source ConfigMap mounted read-only.
    pod["volumes"] = [{"name": "kernel", "configMap": {"name": "scale-src"}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "kernel", "mountPath": "/etc/fleettune/kernel",
                                             "readOnly": True}]
    return job


@pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc is not installed")
def test_user_source_is_compiled_for_real_and_timed_by_a_synthetic_model(api_client, namespace, simulator):
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "scale-src"},
                                                  "data": {"scale.cu": USER_SOURCE}})
    batch.create_namespaced_job(namespace, _user_source_job("compiles", {"block_size_x": 128, "tile": 2}))
    # `tile` undefined: NVRTC's own error, and the configuration is invalid (no retry).
    batch.create_namespaced_job(namespace, _user_source_job("undefined", {"block_size_x": 128}))
    ok = wait_for(lambda: _finished(batch, namespace, "compiles"), 60, "the compiling trial to finish")
    assert ok.type == "Complete"
    result, _ = _answer(_terminated(core, namespace, "compiles")[0].message)
    assert result.outcome == Outcome.OK and result.objective
    assert result.fingerprint.synthetic and result.fingerprint.compute_capability == "8.0"
    answered = wait_for(lambda: _finished(batch, namespace, "undefined"), 60, "the broken trial to finish")
    assert answered.type == "Complete"
    [term] = _terminated(core, namespace, "undefined")
    assert term.exit_code == 0
    broken, _ = _answer(term.message)
    assert broken.outcome == Outcome.COMPILE_ERROR and 'identifier "tile" is undefined' in broken.error
    assert simulator.compiler.compiles == 2


def test_a_pod_on_a_deleted_node_is_never_answered(cluster, api_client, namespace):
    from fleettune_dev.sim import FleetSimulator

    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    node = f"a100-lost-{uuid.uuid4().hex[:6]}"
    core.create_node(cluster.fleet.pool("a100").node_manifest(node))
    # Deleted before the simulated trial (~9 s) ends: its answer is never due.
    with FleetSimulator(cluster.kubeconfig, cluster.fleet, time_scale=10) as slow:
        try:
            job = _trial_job("lost", "a100", {})
            job["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
            batch.create_namespaced_job(namespace, job)
            wait_for(lambda: slow.pending == 1, 60, "the simulator to start the trial")
            [pod] = core.list_namespaced_pod(namespace, label_selector="job-name=lost").items
            assert pod.spec.node_name == node
        finally:
            core.delete_node(node)
        wait_for(lambda: slow.lost == 1, 30, "the trial's answer to come due")
        time.sleep(1.0)
        after = core.read_namespaced_pod(pod.metadata.name, namespace)
        assert after.status.phase != "Succeeded"
        assert not [s for s in after.status.container_statuses or [] if s.state.terminated]
        assert slow.answered == [] and slow.outcomes == {} and not slow.errors
    # No kubelet will ever confirm its deletion (the pod GC would, 40 s on): force it.
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
