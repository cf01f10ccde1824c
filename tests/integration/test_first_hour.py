"""What broke in the first hour of real use, on the real control plane with the
real operator (the chart's RBAC) and the fleet simulator:

1. ``spec.publish.configMapName`` naming a ConfigMap the run does not own (an
   application's, another run's results) replaced it — and owned it, so deleting the run
   garbage-collected it;
2. two runs whose names share their first 40 characters shared a results ConfigMap: the
   second hung while the operator hot-looped on conflicts;
3. a run could get privileged trial Pods with any image;
4. a run name longer than a label value, a search space over 2^63, a 1.5 MB node selector:
   a traceback every step and never a status;
5. ``type: integer`` with a ``range`` always failed (the CRD hands the bounds over as floats).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from fault_support import tracebacks
from operator_support import apply, example, get_run, jobs, stored_records, wait_for, wait_phase

from fleettune import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.integration


def small(name: str, budget: int = 3, **spec: Any) -> dict[str, Any]:
    """The example on the A100 pool: a few cheap trials, random strategy (no model fits)."""
    doc = example(name, trialsPerTarget=budget, parallelism=budget)
    doc["spec"]["targets"] = [t for t in doc["spec"]["targets"] if t["name"] == "a100"]
    doc["spec"]["strategy"] = {"name": "random", "seed": 5}
    doc["spec"].update(spec)
    doc["apiVersion"], doc["kind"] = f"{GROUP}/{VERSION}", "TuningRun"
    return doc


def condition(run: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (run.get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def core_api(api_client: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client)


def custom_api(api_client: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api_client)


def config_map(api_client: Any, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client import ApiException

    try:
        resp = core_api(api_client).read_namespaced_config_map(name, namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return json.loads(resp.data)


def delete_run(cluster: Any, namespace: str, name: str) -> None:
    cluster.kubectl("delete", "-n", namespace, f"{PLURAL}.{GROUP}", name, "--wait=true", "--timeout=60s")


def results_of(cluster: Any, namespace: str, run: str) -> list[dict[str, Any]]:
    """The run's results ConfigMaps, by owner (whatever their labels)."""
    uid = get_run(cluster, namespace, run)["metadata"]["uid"]
    out = cluster.kubectl("get", "configmaps", "-n", namespace, "-o", "json")
    return [cm for cm in json.loads(out.stdout)["items"]
            if any(o["uid"] == uid for o in cm["metadata"].get("ownerReferences") or [])
            and "binaryData" in cm]


def apiserver_count(cluster: Any, resource: str, verb: str, code: str) -> float:
    """apiserver_request_total for (resource, verb, code), summed over its other labels."""
    total = 0.0
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{") and f'resource="{resource}"' in line \
                and f'verb="{verb}"' in line and f'code="{code}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def assert_no_tracebacks(operator: Any, *names: str) -> None:
    found = [t for t in tracebacks(operator.logs()) if not names or any(n[:40] in t for n in names)]
    assert not found, "the operator logged tracebacks:\n" + "\n---\n".join(found[:2])


# ---------------------------------------------------------------------------- 1. publishing


def test_publishing_never_takes_over_a_configmap_the_run_does_not_own(cluster, namespace, simulator, operator,
                                                                     api_client):
    core = core_api(api_client)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "precious-config", "labels": {"app": "web"}},
                                                  "data": {"settings.ini": "[db]\nhost=db.internal\n"}})
    precious = config_map(api_client, namespace, "precious-config")
    assert apply(cluster, namespace, small("owner")).returncode == 0
    assert wait_phase(cluster, namespace, "owner", 180, operator)["status"]["phase"] == "Succeeded"
    (shard,) = results_of(cluster, namespace, "owner")
    records = stored_records(cluster, namespace, "owner")

    thieves = {"thief-app": "precious-config", "thief-results": shard["metadata"]["name"]}
    for run, target in thieves.items():
        assert apply(cluster, namespace, small(run, publish={"configMapName": target})).returncode == 0
    for run, target in thieves.items():
        done = wait_phase(cluster, namespace, run, 180, operator)
        published = condition(done, "Published")
        assert published.get("status") == "False" and published["reason"] == "PublishRefused", done["status"]
        assert published["message"] == (f"spec.publish.configMapName: ConfigMap {target} exists and is not "
                                        "published by this run")
        assert condition(done, "Degraded")["status"] == "True" and "published" not in done["status"]
        assert (condition(done, "Ready")["status"], condition(done, "Ready")["reason"]) == ("False", "PublishRefused")
    after = config_map(api_client, namespace, "precious-config")
    assert after["metadata"]["resourceVersion"] == precious["metadata"]["resourceVersion"], after
    assert after["data"] == precious["data"] and not after["metadata"].get("ownerReferences")
    assert config_map(api_client, namespace, shard["metadata"]["name"])["binaryData"] == shard["binaryData"]
    assert stored_records(cluster, namespace, "owner") == records

    # The name freed, the finished run takes it at once (it watches a name it was refused),
    # not at its next idle wake-up minutes later; until then it said why it could not.
    core.delete_namespaced_config_map("precious-config", namespace)
    taken = wait_for(lambda: (r := get_run(cluster, namespace, "thief-app"))
                     and condition(r, "Published").get("status") == "True" and r, 20, "the freed name to be taken")
    assert taken["status"]["published"] == "precious-config" and condition(taken, "Degraded")["status"] == "False"
    assert config_map(api_client, namespace, "precious-config")["metadata"]["labels"]["fleettune.dev/published-by"] \
        == "thief-app"

    # Deleting the refused runs takes nothing of anyone else's with them.
    for run in thieves:
        delete_run(cluster, namespace, run)
    time.sleep(5)  # the garbage collector acts within a second or two
    assert stored_records(cluster, namespace, "owner") == records
    assert_no_tracebacks(operator)


def test_a_recreated_run_takes_over_the_configmap_it_retained(cluster, namespace, simulator, operator, api_client):
    doc = small("keeper", publish={"configMapName": "keeper-params", "retainOnDelete": True})
    assert apply(cluster, namespace, doc).returncode == 0
    first = wait_phase(cluster, namespace, "keeper", 180, operator)
    assert condition(first, "Published")["status"] == "True" and first["status"]["published"] == "keeper-params"
    kept = config_map(api_client, namespace, "keeper-params")
    assert kept is not None and not kept["metadata"].get("ownerReferences")
    delete_run(cluster, namespace, "keeper")
    time.sleep(3)
    retained = config_map(api_client, namespace, "keeper-params")
    assert retained is not None  # retained
    # A hand edit, so that the re-created run has something to write (it writes only changes).
    key = next(k for k in retained["data"] if k.endswith(".time_ms"))
    core_api(api_client).patch_namespaced_config_map("keeper-params", namespace, {"data": {key: "999"}})

    again = copy.deepcopy(doc)
    again["spec"]["budget"]["trialsPerTarget"] = 6
    again["spec"]["strategy"]["seed"] = 11
    assert apply(cluster, namespace, again).returncode == 0
    second = wait_phase(cluster, namespace, "keeper", 180, operator)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert condition(second, "Published")["status"] == "True", second["status"]["conditions"]
    taken = config_map(api_client, namespace, "keeper-params")
    assert taken["metadata"]["annotations"]["fleettune.dev/published-by-uid"] == second["metadata"]["uid"]
    assert taken["data"][key] != "999" and not taken["metadata"].get("ownerReferences")
    assert_no_tracebacks(operator)


# ---------------------------------------------------------------------------- 2. shared name prefixes


def test_runs_sharing_their_first_40_characters_keep_their_own_results(cluster, namespace, simulator, operator,
                                                                      api_client):
    stem = "conv-fleet-tuning-for-the-imaging-team-x"
    assert len(stem) == 40
    names = [f"{stem}-alpha", f"{stem}-beta"]
    conflicts = apiserver_count(cluster, "configmaps", "POST", "409")
    for name in names:
        assert apply(cluster, namespace, small(name, budget=4)).returncode == 0
    for name in names:
        run = wait_phase(cluster, namespace, name, 180, operator)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        records = stored_records(cluster, namespace, name)
        assert len({(r.target, r.index) for r in records if r.is_observation}) == 4, (name, len(records))
    shards = [{cm["metadata"]["name"] for cm in results_of(cluster, namespace, n)} for n in names]
    assert shards[0] and shards[1] and not shards[0] & shards[1]
    # No storm of failing creates (the bug: 95-150 requests a second, for as long as it ran).
    assert apiserver_count(cluster, "configmaps", "POST", "409") - conflicts < 10

    # Stopping the operator while a run is mid-flight: it stops at once.
    assert apply(cluster, namespace, small("stopping", budget=30)).returncode == 0
    wait_for(lambda: len(stored_records(cluster, namespace, "stopping")) >= 3, 90, "the first records")
    assert operator.proc is not None
    started = time.monotonic()
    operator.proc.terminate()
    operator.proc.wait(timeout=60)
    assert time.monotonic() - started < 15, "SIGTERM took too long"
    assert_no_tracebacks(operator, *names)


def test_a_results_name_held_by_another_configmap_is_left_alone(cluster, namespace, simulator, operator,
                                                              api_client):
    from fleettune.store import shard_name

    doc = small("squatted", budget=4)
    doc["spec"]["targets"][0]["nodeSelector"] = {"fleettune.dev/pool": "no-such-pool"}  # wait with no trial
    assert apply(cluster, namespace, doc).returncode == 0
    run = wait_for(lambda: (r := get_run(cluster, namespace, "squatted")).get("status") and r, 60, "a status")
    name = shard_name("squatted", run["metadata"]["uid"], 0)
    squatter = core_api(api_client).create_namespaced_config_map(
        namespace, {"metadata": {"name": name}, "data": {"mine": "yes"}}, _preload_content=False)
    squatter = json.loads(squatter.data)
    conflicts = apiserver_count(cluster, "configmaps", "POST", "409")
    doc["spec"]["targets"][0]["nodeSelector"] = {"fleettune.dev/pool": "a100"}
    assert apply(cluster, namespace, doc).returncode == 0
    done = wait_phase(cluster, namespace, "squatted", 180, operator)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert len([r for r in stored_records(cluster, namespace, "squatted") if r.is_observation]) == 4
    left = config_map(api_client, namespace, name)
    assert left["metadata"]["resourceVersion"] == squatter["metadata"]["resourceVersion"]
    assert left["data"] == {"mine": "yes"}
    # One refused create of the squatted name, then the next name: no retrying it.
    assert 1 <= apiserver_count(cluster, "configmaps", "POST", "409") - conflicts <= 3
    assert_no_tracebacks(operator)


# ---------------------------------------------------------------------------- 3. trial policy


def test_privileged_trials_and_other_images_are_the_operators_to_allow(cluster, namespace, simulator, operator):
    cases = {
        "privileged": ("spec.targets[0].allowPrivileged", lambda s: s["targets"][0].update(allowPrivileged=True)),
        "alpine": ("spec.targets[0].image",
                   lambda s: s["targets"][0].update(image="docker.io/library/alpine:latest")),
        "template": ("spec.jobTemplate.image", lambda s: s.update(jobTemplate={"image": "alpine"})),
    }
    for name, (_, change) in cases.items():
        doc = small(name)
        change(doc["spec"])
        assert apply(cluster, namespace, doc).returncode == 0
    # The operator's own job image repository, any tag (the example's Jetson image): allowed.
    ok = small("own-image")
    ok["spec"]["targets"][0]["image"] = "ghcr.io/fleettune/job:0.1.0-l4t"
    assert apply(cluster, namespace, ok).returncode == 0
    for name, (field, _) in cases.items():
        run = wait_phase(cluster, namespace, name, 60, operator)
        ready = condition(run, "Ready")
        assert run["status"]["phase"] == "Failed" and ready["reason"] == "Forbidden", run["status"]
        assert ready["message"].startswith(f"{field}: "), ready["message"]
        assert not jobs(cluster, namespace, name)
    assert wait_phase(cluster, namespace, "own-image", 180, operator)["status"]["phase"] == "Succeeded"

    # The admin allows them: the same runs tune, with what they asked for.
    operator.stop()
    operator.env = {"FLEETTUNE_ALLOW_PRIVILEGED_TRIALS": "true", "FLEETTUNE_ALLOWED_IMAGES": "docker.io/library/alpine"}
    # Every Job as created: a small run's Jobs are recorded and deleted within a second, so
    # polling for them races the operator.
    with JobWatch(cluster, namespace) as watch:
        operator.start()
        seen = wait_for(lambda: (f := watch.first_of_each_run()).keys() >= {"privileged", "alpine"} and f, 90,
                        "the allowed runs' Jobs")
    priv = seen["privileged"]
    assert priv["containers"][0]["securityContext"] == {} and priv["securityContext"] == {}
    alpine = seen["alpine"]
    assert alpine["containers"][0]["image"] == "docker.io/library/alpine:latest"
    assert alpine["containers"][0]["securityContext"]["privileged"] is False
    # Each run's status says Failed (Forbidden) until the restarted operator's first step
    # writes its own: a finished phase from before the restart is not the answer.
    def tuned(name: str) -> dict[str, Any] | None:
        run = get_run(cluster, namespace, name)
        fresh = condition(run, "Ready").get("reason") != "Forbidden"
        return run if fresh and (run.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    for name in cases:
        run = wait_for(lambda name=name: tuned(name), 180, f"{name} to tune once allowed")
        assert run["status"]["phase"] == "Succeeded", run["status"]
    assert_no_tracebacks(operator)



class JobWatch:
    """Every Job of a namespace as ``kubectl get --watch`` streams it, to a file read at will:
    the operator deletes a trial's Job within a second of recording it, faster than polling."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace

    def __enter__(self) -> JobWatch:
        fd, name = tempfile.mkstemp(prefix="jobs-", suffix=".json")
        self._out = Path(name)
        with os.fdopen(fd, "w") as out:
            self._proc = subprocess.Popen([str(self.cluster.kubectl_path()), f"--kubeconfig={self.cluster.kubeconfig}",
                                           "get", "jobs", "-n", self.namespace, "--watch", "-o", "json"], stdout=out)
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)
        self._final = self._out.read_text()
        self._out.unlink()

    def first_of_each_run(self) -> dict[str, dict[str, Any]]:
        """Run name -> the Pod template of its first Job seen (so far, while watching)."""
        first: dict[str, dict[str, Any]] = {}
        text = getattr(self, "_final", None)
        for job in _json_stream(self._out.read_text() if text is None else text):
            first.setdefault(job["metadata"]["labels"][f"{GROUP}/run"], job["spec"]["template"]["spec"])
        return first


def _json_stream(text: str) -> list[dict[str, Any]]:
    """The objects `kubectl get --watch -o json` printed; the last may be cut off mid-write."""
    decoder, out, pos = json.JSONDecoder(), [], 0
    while (start := text.find("{", pos)) >= 0:
        try:
            doc, pos = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            break
        out.append(doc)
    return out


def test_trial_pods_take_the_operators_uid_secrets_and_service_account(cluster, namespace, simulator, operator,
                                                                       api_client):
    """No fixed UID where the platform assigns one (OpenShift restricted-v2), pull
    secrets for private registries, a ServiceAccount only where the admin allows it."""
    core = core_api(api_client)
    for account in ("trial", "gpu-team"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    operator.stop()
    operator.env = {"FLEETTUNE_TRIAL_RUN_AS_USER": "", "FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS": "mirror",
                    "FLEETTUNE_TRIAL_SERVICE_ACCOUNT": "trial", "FLEETTUNE_ALLOWED_SERVICE_ACCOUNTS": "gpu-*"}
    operator.start()
    with JobWatch(cluster, namespace) as watch:
        runs = {
            "own": small("own", budget=2, jobTemplate={"imagePullSecrets": [{"name": "team"}]}),
            "team": small("team", budget=2, jobTemplate={"serviceAccountName": "gpu-team"}),
            "admin": small("admin", budget=2, jobTemplate={"serviceAccountName": "admin"}),
        }
        for doc in runs.values():
            assert apply(cluster, namespace, doc).returncode == 0
        for name in ("own", "team"):
            assert wait_phase(cluster, namespace, name, 180, operator)["status"]["phase"] == "Succeeded"
        refused = wait_phase(cluster, namespace, "admin", 60, operator)
        ready = condition(refused, "Ready")
        assert refused["status"]["phase"] == "Failed" and ready["reason"] == "Forbidden", refused["status"]
        assert ready["message"].startswith("spec.jobTemplate.serviceAccountName: ServiceAccount 'admin'")
        assert not jobs(cluster, namespace, "admin")
    pods = watch.first_of_each_run()
    assert set(pods) == {"own", "team"}, sorted(pods)
    for name, pod in pods.items():
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}, name
        assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["automountServiceAccountToken"] is False
    assert pods["own"]["imagePullSecrets"] == [{"name": "mirror"}, {"name": "team"}]
    assert pods["own"]["serviceAccountName"] == "trial"
    assert pods["team"]["imagePullSecrets"] == [{"name": "mirror"}]
    assert pods["team"]["serviceAccountName"] == "gpu-team"
    assert_no_tracebacks(operator)


# ---------------------------------------------------------------------------- 4. runs that never got a status


def test_a_run_name_of_253_characters_tunes_end_to_end(cluster, namespace, simulator, operator):
    name = ("gemm-" + "very-long-name-" * 17)[:252] + "z"
    assert len(name) == 253
    assert apply(cluster, namespace, small(name, budget=4, publish={"configMapName": "long-tuned"})).returncode == 0
    run = wait_phase(cluster, namespace, name, 180, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert condition(run, "Published")["status"] == "True"
    assert len([r for r in stored_records(cluster, namespace, name) if r.is_observation]) == 4
    answered = [k for k in simulator.answered if k[0] == namespace and k[1] == name]
    assert len(answered) >= 4
    assert_no_tracebacks(operator)


def test_a_search_space_beyond_int64_gets_a_status(cluster, namespace, simulator, operator):
    doc = small("huge-space", budget=2)
    doc["spec"]["kernel"].pop("defaultConfig")
    doc["spec"]["constraints"] = []
    doc["spec"]["parameters"] = [{"name": f"p{i}", "values": list(range(16))} for i in range(20)]  # 2^80
    assert apply(cluster, namespace, doc).returncode == 0
    run = wait_for(lambda: (r := get_run(cluster, namespace, "huge-space")).get("status", {}).get("targets") and r,
                   90, "a status with its targets")
    (target,) = run["status"]["targets"]
    assert target["spaceSize"] == 2**63 - 1, target
    assert condition(run, "Ready")["reason"] != "InvalidSpec"
    assert_no_tracebacks(operator, "huge-space")


def test_a_node_selector_of_1_5_mb_ends_in_a_readable_condition(cluster, namespace, operator, api_client):
    doc = small("huge-selector")
    doc["metadata"] = {"name": "huge-selector"}
    doc["spec"]["targets"][0]["nodeSelector"] = {"fleettune.dev/pool": "a" * 1_500_000}
    # Created, not applied: kubectl apply's last-applied annotation would double it past etcd's limit.
    custom_api(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc,
                                                           _request_timeout=60)
    run = wait_phase(cluster, namespace, "huge-selector", 60, operator)
    ready = condition(run, "Ready")
    assert run["status"]["phase"] == "Failed" and ready["reason"] == "InvalidSpec", ready
    assert ready["message"].startswith("spec.targets[0].nodeSelector: ") and len(ready["message"]) < 1000
    assert len(json.dumps(run["status"])) < 8 * 1024
    assert_no_tracebacks(operator, "huge-selector")


# ---------------------------------------------------------------------------- 5. integer ranges


def test_integer_ranges_tune_and_fractional_bounds_are_named(cluster, namespace, simulator, operator):
    doc = small("int-range", budget=3)
    doc["spec"]["kernel"].pop("defaultConfig")
    doc["spec"]["parameters"].append({"name": "unroll", "type": "integer", "range": {"min": 1, "max": 4}})
    bad = copy.deepcopy(doc)
    bad["metadata"]["name"] = "int-fraction"
    bad["spec"]["parameters"][-1]["range"] = {"min": 1.5, "max": 4}
    field = f"spec.parameters[{len(doc['spec']['parameters']) - 1}].range.min"
    for d in (doc, bad):
        assert apply(cluster, namespace, d).returncode == 0
    run = wait_phase(cluster, namespace, "int-range", 180, operator)
    assert condition(run, "Ready")["reason"] != "InvalidSpec", condition(run, "Ready")
    assert run["status"]["targets"][0]["spaceSize"] > 0
    configs = [r.config for r in stored_records(cluster, namespace, "int-range")]
    assert configs and all(isinstance(c["unroll"], int) and 1 <= c["unroll"] <= 4 for c in configs)
    failed = wait_phase(cluster, namespace, "int-fraction", 60, operator)
    ready = condition(failed, "Ready")
    assert ready["reason"] == "InvalidSpec" and ready["message"].startswith(f"{field}: expected an integer"), ready
