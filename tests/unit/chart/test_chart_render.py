"""The Helm chart: lint, render over several values files, least-privilege RBAC, schema typos.

Every rendered object is also validated by the API server in
tests/integration/test_chart.py; here the chart's own promises are checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import CHART, LONGEST_RELEASE, VALUES, Helm

ROOT = CHART.parents[1]
VALUE_FILES = sorted(p.name for p in VALUES.glob("*.yaml"))
OPERATOR_WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_value_files_exist() -> None:
    assert len(VALUE_FILES) >= 5


@pytest.mark.parametrize("values", ["", *VALUE_FILES])
def test_lint_strict(chart: Helm, values: str) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(VALUES / values)] if values else [])
    out = chart.run(*args)
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("values", ["", *VALUE_FILES])
def test_renders_well_formed_objects(chart: Helm, values: str) -> None:
    docs = chart.template(*([values] if values else []))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ClusterRole", "ClusterRoleBinding"} <= kinds
    names = set()
    for d in docs:
        meta = d["metadata"]
        assert d["apiVersion"] and meta["name"]
        assert meta["labels"]["app.kubernetes.io/instance"] == "ft"
        key = (d["kind"], meta.get("namespace"), meta["name"])
        assert key not in names, f"duplicate {key}"
        names.add(key)


NAME_MAX = 63  # a DNS label (a Service's name) and a label value


def _check_names_and_labels(docs: list[dict[str, Any]]) -> None:
    for d in docs:
        meta = d["metadata"]
        assert len(meta["name"]) <= NAME_MAX, f"{d['kind']} {meta['name']} is {len(meta['name'])} characters"
        labels = dict(meta.get("labels") or {})
        template = (d.get("spec") or {}).get("template") or {}
        labels.update((template.get("metadata") or {}).get("labels") or {})
        for key, value in labels.items():
            assert len(str(value)) <= NAME_MAX, f"{d['kind']} {meta['name']}: label {key}={value}"


@pytest.mark.parametrize("values", ["", *VALUE_FILES])
def test_a_53_character_release_name_fits(chart: Helm, values: str) -> None:
    """Helm allows release names of 53 characters; every name and label value the chart
    makes must still fit in 63 (a Service name is a DNS label)."""
    assert len(LONGEST_RELEASE) == 53
    sets = ("metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true")
    docs = chart.template(*([values] if values else []), sets=sets, release=LONGEST_RELEASE,
                          namespace="a-namespace-name-that-is-long-too")
    if not values:
        assert {"Service", "Deployment", "ClusterRole", "ServiceMonitor", "PrometheusRule", "ConfigMap",
                "NetworkPolicy"} <= {d["kind"] for d in docs}
    _check_names_and_labels(docs)
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "cutting names made two objects the same"


def test_names_follow_the_usual_helpers(chart: Helm) -> None:
    def names(release: str, *sets: str) -> set[str]:
        docs = chart.template(release=release, sets=sets)
        return {d["metadata"]["name"] for d in docs if d["kind"] in {"Deployment", "ServiceAccount", "Role"}}

    # The README's `helm install fleettune ...`: not fleettune-fleettune.
    assert names("fleettune") == {"fleettune"}
    assert names("fleettune-prod") == {"fleettune-prod"}
    assert names("ft") == {"ft-fleettune"}
    assert names("ft", "nameOverride=tuner") == {"ft-tuner"}
    assert names("ft", "fullnameOverride=gpu-tuner") == {"gpu-tuner"}
    docs = chart.template(release="fleettune")
    svc = one(docs, "Service")
    assert svc["metadata"]["name"] == "fleettune-metrics"
    assert one(docs, "ConfigMap")["metadata"]["name"] == "fleettune-dashboard"
    # The Service still selects the operator's Pod with an overridden name.
    docs = chart.template(sets=("nameOverride=tuner",))
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/name"] == "tuner"
    assert all(pod_labels[k] == v for k, v in one(docs, "Service")["spec"]["selector"].items())


def test_long_cluster_scoped_names_stay_apart(chart: Helm) -> None:
    """ClusterRoles are named after the release and its namespace: two long namespaces that
    share their beginning get two ClusterRoles, not one cut name."""
    roles = set()
    for ns in ("gpu-tuning-with-a-very-long-namespace-name-a", "gpu-tuning-with-a-very-long-namespace-name-b"):
        docs = chart.template(release=LONGEST_RELEASE, namespace=ns)
        role, binding = one(docs, "ClusterRole"), one(docs, "ClusterRoleBinding")
        assert len(role["metadata"]["name"]) <= NAME_MAX
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        roles.add(role["metadata"]["name"])
    assert len(roles) == 2


def test_default_install(chart: Helm) -> None:
    docs = chart.template()
    c = container(docs)
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    assert c["args"] == ["--liveness=http://0.0.0.0:8081/healthz", "--namespace=fleettune", "--metrics-port=8080"]
    assert c["image"] == "ghcr.io/fleettune/operator:0.1.0"
    # Non-root, read-only, nothing to escalate to.
    pod_sc = dep["spec"]["template"]["spec"]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["livenessProbe"]["httpGet"]["port"] == "health" and c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    # Metrics: the Service selects the operator's pod and names the container's port.
    svc = one(docs, "Service")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in svc["spec"]["selector"].items())
    assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in c["ports"]}
    assert not by_kind(docs, "ServiceMonitor")  # needs the Prometheus Operator: opt-in
    assert not by_kind(docs, "PrometheusRule")
    # Today's fixed UID for the operator and its trials, unless told otherwise.
    assert (pod_sc["runAsUser"], pod_sc["runAsGroup"], pod_sc["fsGroup"]) == (10001, 10001, 10001)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FLEETTUNE_TRIAL_RUN_AS_USER"] == "10001"
    assert not {"FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS", "FLEETTUNE_TRIAL_SERVICE_ACCOUNT"} & set(env)


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_default_memory_is_set_from_the_measurement(chart: Helm) -> None:
    """`fleettune bench memory` (docs/benchmarks.md): the largest run measured, 24 targets over
    spaces of 1.9 million configurations, peaked at 1037 MiB with torch's CUDA build (the
    image's CPU build is smaller); the demo stays near 800 MiB with it, about 550 MiB without."""
    res = container(chart.template())["resources"]
    request, limit = _mib(res["requests"]["memory"]), _mib(res["limits"]["memory"])
    assert limit >= 1.4 * 1037, "the limit must leave headroom above the largest measured run"
    assert 550 <= request <= limit


def test_trial_policy_is_off_by_default_and_set_from_values(chart: Helm) -> None:
    """Privileged trials and images beyond the job image's repository are the admin's to allow."""
    env = {e["name"]: e.get("value") for e in container(chart.template())["env"]}
    assert env["FLEETTUNE_ALLOW_PRIVILEGED_TRIALS"] == "false" and "FLEETTUNE_ALLOWED_IMAGES" not in env
    sets = ("trialPolicy.allowPrivileged=true", "trialPolicy.allowedImages={docker.io/library/alpine,reg.local/}")
    env = {e["name"]: e.get("value") for e in container(chart.template(sets=sets))["env"]}
    assert env["FLEETTUNE_ALLOW_PRIVILEGED_TRIALS"] == "true"
    assert env["FLEETTUNE_ALLOWED_IMAGES"] == "docker.io/library/alpine,reg.local/"


def test_a_default_queue_and_multikueue_workers_reach_the_operator(chart: Helm) -> None:
    """trialPolicy.queue sets the default Kueue queue; each MultiKueue worker's kubeconfig is
    mounted read-only from its Secret, and the operator is told where (docs/operations/multikueue.md)."""
    plain = chart.template()
    env = {e["name"]: e.get("value") for e in container(plain)["env"]}
    assert "FLEETTUNE_DEFAULT_QUEUE" not in env and "FLEETTUNE_WORKER_KUBECONFIGS" not in env
    sets = ("trialPolicy.queue=gpu-tuning", "multiKueue.workers[0].name=jetson-site",
            "multiKueue.workers[0].secretName=ft-worker-jetson", "multiKueue.workers[1].name=lab",
            "multiKueue.workers[1].secretName=ft-worker-lab", "multiKueue.workers[1].key=config")
    docs = chart.template(sets=sets)
    c = container(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FLEETTUNE_DEFAULT_QUEUE"] == "gpu-tuning"
    assert env["FLEETTUNE_WORKER_KUBECONFIGS"] == "/etc/fleettune/workers"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["worker-lab"] == {"name": "worker-lab", "mountPath": "/etc/fleettune/workers/lab", "readOnly": True}
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["worker-jetson-site"]["secret"] == {
        "secretName": "ft-worker-jetson", "items": [{"key": "kubeconfig", "path": "kubeconfig"}]}
    assert volumes["worker-lab"]["secret"]["items"] == [{"key": "config", "path": "kubeconfig"}]
    with pytest.raises(Exception, match="queue"):
        chart.template(sets=("trialPolicy.queue=Not_A_Queue",))


def test_openshift_leaves_uids_to_the_platform(chart: Helm) -> None:
    """restricted-v2 assigns UIDs: no runAsUser/runAsGroup/fsGroup in the operator's Pod or (through
    the operator's environment) its trials; everything else of the restricted profile stays."""
    docs = chart.template("openshift.yaml")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    c = container(docs)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["capabilities"]["drop"] == [
        "ALL"]
    assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FLEETTUNE_TRIAL_RUN_AS_USER"] == ""
    assert env["FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS"] == "mirror-pull,team-pull"
    assert env["FLEETTUNE_TRIAL_SERVICE_ACCOUNT"] == "fleettune-trials"
    assert env["FLEETTUNE_ALLOWED_SERVICE_ACCOUNTS"] == "gpu-*"
    assert env["HTTPS_PROXY"] == "http://proxy.example:3128"
    # The whole Pod security context can go too (null; an empty map is merged with the defaults).
    pod = one(chart.template(sets=("podSecurityContext=null", "securityContext=null")), "Deployment")
    assert "securityContext" not in pod["spec"]["template"]["spec"]
    assert "securityContext" not in pod["spec"]["template"]["spec"]["containers"][0]
    uid = container(chart.template(sets=("trialPolicy.runAsUser=1000680000",)))
    assert {e["name"]: e.get("value") for e in uid["env"]}["FLEETTUNE_TRIAL_RUN_AS_USER"] == "1000680000"


@pytest.mark.parametrize("values", ["", *VALUE_FILES])
def test_the_operator_reads_the_trial_policy_the_chart_sets(chart: Helm, values: str) -> None:
    """The rendered environment goes through the operator's own reader (TrialPolicy.from_env,
    which refuses to start on a value it cannot read)."""
    from fleettune.admission import TrialPolicy

    env = {e["name"]: e["value"] for e in container(chart.template(*([values] if values else [])))["env"]
           if "value" in e}
    policy = TrialPolicy.from_env(env)
    if values == "openshift.yaml":
        assert policy.run_as_user is None
        assert policy.image_pull_secrets == ("mirror-pull", "team-pull")
        assert policy.service_account == "fleettune-trials"
    else:
        assert policy.run_as_user == 10001 and policy.image_pull_secrets == () and policy.service_account is None


def test_the_operator_reads_the_node_wait_the_chart_sets(chart: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleettune.controller.handlers import NODE_WAIT_ENV, node_wait_from_env

    for sets, expected in (((), 600.0), (("nodeWaitSeconds=0",), 0.0), (("nodeWaitSeconds=1800",), 1800.0)):
        env = {e["name"]: e["value"] for e in container(chart.template(sets=sets))["env"] if "value" in e}
        monkeypatch.setenv(NODE_WAIT_ENV, env[NODE_WAIT_ENV])
        assert node_wait_from_env() == expected


def test_the_operator_reads_the_model_threads_the_chart_sets(chart: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleettune.controller.handlers import MODEL_THREADS_ENV, model_threads_from_env

    for sets, expected in (((), 2), (("modelThreads=1",), 1)):
        env = {e["name"]: e["value"] for e in container(chart.template(sets=sets))["env"] if "value" in e}
        monkeypatch.setenv(MODEL_THREADS_ENV, env[MODEL_THREADS_ENV])
        assert model_threads_from_env() == expected
    with pytest.raises(AssertionError, match="modelThreads"):
        chart.template(sets=("modelThreads=0",))


def test_crd_is_the_generated_one_with_a_keep_policy(chart: Helm) -> None:
    crd = one(chart.template(), "CustomResourceDefinition")
    generated = yaml.safe_load((ROOT / "crds" / "tuningrun.yaml").read_text())
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["spec"] == generated["spec"]  # the chart cannot ship a stale CRD
    assert (CHART / "files" / "tuningrun.crd.yaml").read_text() == (ROOT / "crds" / "tuningrun.yaml").read_text()
    no_keep = one(chart.template(sets=("crds.keep=false",)), "CustomResourceDefinition")
    assert "annotations" not in no_keep["metadata"]
    assert not by_kind(chart.template("minimal.yaml"), "CustomResourceDefinition")


def _rules(docs: list[dict[str, Any]], kind: str) -> list[tuple[str | None, dict[str, Any]]]:
    return [(d["metadata"].get("namespace"), r) for d in by_kind(docs, kind) for r in d["rules"]]


def _grants(rules: list[tuple[str | None, dict[str, Any]]], resource: str) -> set[str]:
    return {v for _, r in rules if resource in r["resources"] for v in r["verbs"]}


@pytest.mark.parametrize("values", ["", *VALUE_FILES])
def test_rbac_has_no_wildcards_and_no_secrets(chart: Helm, values: str) -> None:
    docs = chart.template(*([values] if values else []))
    for _, rule in _rules(docs, "Role") + _rules(docs, "ClusterRole"):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert "secrets" not in rule["resources"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_namespaced_rbac(chart: Helm) -> None:
    docs = chart.template("namespaced.yaml")
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = by_kind(docs, "RoleBinding")
    assert {b["subjects"][0]["namespace"] for b in bindings} == {"fleettune"}
    assert {b["roleRef"]["name"] for b in bindings} == {r["metadata"]["name"] for r in roles}
    role_rules = _rules(docs, "Role")
    assert _grants(role_rules, "jobs") == {"get", "list", "watch", "create", "delete"}
    assert _grants(role_rules, "tuningruns/status") == {"get", "patch"}
    assert _grants(role_rules, "configmaps") == {"get", "list", "watch", "create", "update"}
    assert _grants(role_rules, "pods") == {"get", "list", "watch"}
    assert _grants(role_rules, "pods/log") == {"get"}  # a running batch's answers (followAnswers)
    # blockOwnerDeletion on the trial Jobs (OwnerReferencesPermissionEnforcement): update on the
    # finalizers subresource only, never on the runs themselves.
    assert _grants(role_rules, "tuningruns/finalizers") == {"update"}
    assert "update" not in _grants(role_rules, "tuningruns")
    # Cluster-wide, only reads of cluster-scoped objects: no write anywhere else.
    cluster_rules = _rules(docs, "ClusterRole")
    assert {res for _, r in cluster_rules for res in r["resources"]} == {
        "nodes", "customresourcedefinitions", "namespaces"
    }
    assert not {v for _, r in cluster_rules for v in r["verbs"]} & OPERATOR_WRITES
    args = container(docs)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args
    env = {e["name"]: e.get("value") for e in container(docs)["env"]}
    assert env["FLEETTUNE_JOB_IMAGE"] == "registry.example/mirror/fleettune-job:0.1.0"
    assert env["FLEETTUNE_ALLOWED_IMAGES"] == "registry.example/gpu-kernels/,ghcr.io/fleettune/job"
    assert env["FLEETTUNE_ALLOW_PRIVILEGED_TRIALS"] == "false"
    assert container(docs)["image"].startswith("ghcr.io/fleettune/operator@sha256:0123")


def test_clusterwide_rbac(chart: Helm) -> None:
    docs = chart.template("clusterwide.yaml")
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    rules = _rules(docs, "ClusterRole")
    assert _grants(rules, "jobs") == {"get", "list", "watch", "create", "delete"}
    assert _grants(rules, "tuningruns") == {"get", "list", "watch", "patch"}
    assert _grants(rules, "tuningruns/finalizers") == {"update"}
    args = container(docs)["args"]
    assert "--all-namespaces" in args and "--verbose" in args
    assert not [a for a in args if a.startswith("--namespace")]


def test_reading_no_logs_grants_no_log_access(chart: Helm) -> None:
    docs = chart.template("namespaced.yaml", sets=("followAnswers=0",))
    assert not _grants(_rules(docs, "Role"), "pods/log")
    assert {e["name"]: e.get("value") for e in container(docs)["env"]}["FLEETTUNE_FOLLOW_ANSWERS"] == "0"


def test_rbac_renders_alone_as_plain_manifests(chart: Helm) -> None:
    # What a test (or a reviewer) applies to act as the operator without Helm.
    docs = chart.template(extra=("--show-only", "templates/rbac.yaml", "--show-only", "templates/serviceaccount.yaml"))
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def test_ha_with_peering(chart: Helm) -> None:
    docs = chart.template("ha.yaml")
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--peering=fleettune-ha" in container(docs)["args"]
    peering = one(docs, "KopfPeering")
    assert (peering["metadata"]["name"], peering["metadata"]["namespace"]) == ("fleettune-ha", "team-a")
    assert "kopfpeerings" in {res for _, r in _rules(docs, "Role") for res in r["resources"]}
    cw = chart.template("ha.yaml", sets=("clusterWide=true",))
    assert one(cw, "ClusterKopfPeering")["metadata"]["name"] == "fleettune-ha"
    assert "clusterkopfpeerings" in {res for _, r in _rules(cw, "ClusterRole") for res in r["resources"]}
    # The peering CRDs ship in crds/ (installed before templates); not rendered without --include-crds.
    crds = chart.template("ha.yaml", extra=("--include-crds",))
    assert {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"} <= {
        d["metadata"]["name"] for d in by_kind(crds, "CustomResourceDefinition")
    }


def test_monitoring(chart: Helm) -> None:
    docs = chart.template("monitoring.yaml")
    sm = one(docs, "ServiceMonitor")
    svc = one(docs, "Service")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert all(svc["metadata"]["labels"][k] == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    endpoint = sm["spec"]["endpoints"][0]
    assert endpoint["port"] == svc["spec"]["ports"][0]["name"] and endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s" and endpoint["metricRelabelings"][0]["action"] == "drop"
    # The series' own `namespace` (the run's) must win over the target's (the operator's), or
    # it becomes exported_namespace and same-named runs of two namespaces merge.
    assert endpoint["honorLabels"] is True
    off = one(chart.template("monitoring.yaml", sets=("metrics.serviceMonitor.honorLabels=false",)), "ServiceMonitor")
    assert off["spec"]["endpoints"][0]["honorLabels"] is False
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"FleettuneRunStuck", "FleettunePoolUnschedulable", "FleettuneInfraErrorsRising",
                           "FleettunePoolStale"}
    assert all(r["labels"]["team"] == "gpu-platform" for r in alerts.values())
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["fleettune"]
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert json.loads(cm["data"]["fleettune.json"]) == json.loads((CHART / "dashboards" / "fleettune.json").read_text())


def test_minimal(chart: Helm) -> None:
    docs = chart.template("minimal.yaml")
    assert not by_kind(docs, "Service") and not by_kind(docs, "ConfigMap") and not by_kind(docs, "ServiceAccount")
    assert not by_kind(chart.template("minimal.yaml", sets=("metrics.prometheusRule.enabled=true",)), "PrometheusRule")
    assert "--metrics-port=0" in container(docs)["args"]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-fleettune"
    assert {b["subjects"][0]["name"] for b in by_kind(docs, "RoleBinding")} == {"platform-fleettune"}


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("watchNamespace={a}",), "watchNamespace"),  # top-level typo
        (("metrics.serviceMonitor.enable=true",), "enable"),
        (("image.tags=v1",), "tags"),
        (("crds.keepp=false",), "keepp"),
        (("dashboard.label.grafana_dashboard=1",), "label"),
        (("logLevel=trace",), "logLevel"),
        (("replicaCount=2",), "peering"),  # two operators without peering would duplicate Jobs
        (("watchNamespaces={Team_A}",), "watchNamespaces"),
        (("metrics.serviceMonitor.interval=often",), "interval"),
        (("trialPolicy.allowPriviledged=true",), "allowPriviledged"),
        (("trialPolicy.allowPrivileged=yes",), "allowPrivileged"),
        (("trialPolicy.allowedImages={a b}",), "allowedImages"),
        (("trialPolicy.runAsUser=root",), "runAsUser"),
        (("trialPolicy.runAsUser=0",), "runAsUser"),
        (("trialPolicy.imagePullSecrets={a,b c}",), "imagePullSecrets"),
        (("trialPolicy.serviceAcountName=x",), "serviceAcountName"),
        (("trialNetworkPolicy.enable=false",), "enable"),
        (("nameOverride=Tuner_1",), "nameOverride"),
        (("fullnameOverride=" + "x" * 64,), "fullnameOverride"),
        (("extraEnv[0].value=x",), "name"),
        (("podSecurityContext.runAsUser=me",), "runAsUser"),
        (("metrics.prometheusRule.enable=true",), "enable"),
        (("metrics.prometheusRule.runStuckAfter=soon",), "runStuckAfter"),
        (("metrics.prometheusRule.infraErrorRatio=1.5",), "infraErrorRatio"),
        (("metrics.serviceMonitor.honorLabels=yes",), "honorLabels"),
    ],
)
def test_schema_rejects_typos_and_bad_values(chart: Helm, sets: tuple[str, ...], message: str) -> None:
    proc = chart.run("template", "ft", str(CHART), *[a for s in sets for a in ("--set", s)], check=False)
    assert proc.returncode != 0, f"{sets} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr


def test_schema_accepts_the_documented_settings(chart: Helm) -> None:
    # The negative tests above would pass on a chart that rejects everything.
    chart.template(sets=("replicaCount=3", "peering.enabled=true", "metrics.serviceMonitor.labels.release=kps",
                         "dashboard.annotations.grafana_folder=GPU", "jobImage.repository=mirror/job"))
    # The common values of other charts: each accepted and rendered.
    common = (
        "nameOverride=tuner", "fullnameOverride=gpu-tuner", "podSecurityContext.runAsUser=2000",
        "securityContext.runAsNonRoot=true", "extraEnv[0].name=A", "extraEnv[0].value=b",
        "podAnnotations.team=gpu", "podLabels.tier=ops", "nodeSelector.pool=system",
        "tolerations[0].key=dedicated", "tolerations[0].operator=Exists", "affinity.nodeAffinity=null",
        "priorityClassName=system-cluster-critical", "resources.limits.cpu=2", "imagePullSecrets[0].name=regcred",
        "trialPolicy.runAsUser=null", "trialPolicy.imagePullSecrets={regcred}", "trialPolicy.serviceAccountName=tr",
        "metrics.prometheusRule.enabled=true", "metrics.prometheusRule.infraErrorRatio=0.5",
    )
    docs = chart.template(sets=common)
    pod = one(docs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"team": "gpu"} and pod["metadata"]["labels"]["tier"] == "ops"
    spec = pod["spec"]
    assert spec["securityContext"]["runAsUser"] == 2000 and spec["nodeSelector"] == {"pool": "system"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert spec["priorityClassName"] == "system-cluster-critical" and spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["containers"][0]["resources"]["limits"]["cpu"] == 2
    assert {"name": "A", "value": "b"} in spec["containers"][0]["env"]
    assert one(docs, "Deployment")["metadata"]["name"] == "gpu-tuner"
    infra = next(r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]
                 if r["alert"] == "FleettuneInfraErrorsRising")
    assert ") > 0.5\n" in infra["expr"]


def test_values_and_schema_agree() -> None:
    """Every key in values.yaml is described by the schema (and every object closed to typos)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if node.get("type") != "object" or not isinstance(value, dict):
            return
        props = node.get("properties")
        if props is None:
            return  # free-form maps (labels, resources)
        assert node.get("additionalProperties") is False, f"{path or '<root>'} accepts unknown keys"
        for key, sub in value.items():
            assert key in props, f"{path}.{key} missing from values.schema.json"
            walk(sub, props[key], f"{path}.{key}")

    walk(values, schema, "")


def _policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["namespace"]: d for d in by_kind(docs, "NetworkPolicy")}


def test_trial_pods_get_a_default_deny_network_policy(chart: Helm) -> None:
    """Trials run user-supplied CUDA and need no network (the result goes to the termination
    log): every Pod the operator creates is cut off, both ways, in every watched namespace."""
    from fleettune.labels import MANAGED_BY, MANAGER

    docs = chart.template("namespaced.yaml")
    policies = _policies(docs)
    assert set(policies) == {"team-a", "team-b"}
    for policy in policies.values():
        spec = policy["spec"]
        assert spec["podSelector"] == {"matchLabels": {MANAGED_BY: MANAGER}}  # the labels of trial Pods
        assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
        assert "ingress" not in spec and "egress" not in spec  # no rule: nothing allowed
    # ... and never the operator's own Pod (it must reach the API server).
    operator_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not all(operator_labels.get(k) == v for k, v in {MANAGED_BY: MANAGER}.items())
    assert not by_kind(chart.template("namespaced.yaml", sets=("trialNetworkPolicy.enabled=false",)),
                       "NetworkPolicy")
    # Cluster-wide, the namespaces where runs are must be named (none rendered otherwise).
    assert not by_kind(chart.template("clusterwide.yaml"), "NetworkPolicy")
    named = _policies(chart.template("clusterwide.yaml", sets=("trialNetworkPolicy.namespaces={gpu-a,gpu-b}",)))
    assert set(named) == {"gpu-a", "gpu-b"}
    # An egress the admin allows after all (e.g. a license server).
    allowed = _policies(chart.template(sets=("trialNetworkPolicy.egress[0].ports[0].port=27000",)))
    assert allowed["fleettune"]["spec"]["egress"] == [{"ports": [{"port": 27000}]}]


def test_chart_files_are_tracked_by_path() -> None:
    # The CRD is a template now: a copy left in crds/ would be installed twice.
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["kopf-peering.yaml"]
    assert Path(CHART / "templates" / "NOTES.txt").exists()


@pytest.mark.parametrize("values", ["", *VALUE_FILES])
def test_deployment_args_are_accepted_by_the_operator_cli(
    chart: Helm, values: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The chart and `fleettune operator` agree on flags (a mismatch is a crash-looping pod)."""
    import asyncio

    import kopf

    from fleettune.controller import run

    calls: list[dict[str, Any]] = []

    def fake_operator(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return asyncio.sleep(0)

    monkeypatch.setattr(kopf, "operator", fake_operator)
    # The operator checks that it has a cluster before it starts (in its Pod, the service
    # account): a kubeconfig stands in for it, never contacted.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    # (The client reads $KUBECONFIG once, at import.)
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    from fleettune import metrics

    served: list[tuple[Any, ...]] = []
    monkeypatch.setattr(metrics, "start_http_server", lambda *args: served.append(args))
    docs = chart.template(*([values] if values else []))
    c = container(docs)
    assert c["command"] == ["fleettune", "operator"]
    try:
        run.main(c["args"])
    except SystemExit as exc:  # argparse: an unknown flag
        pytest.fail(f"fleettune operator rejects {c['args']}: exit {exc.code}")
    (kwargs,) = calls
    values_doc = yaml.safe_load((VALUES / values).read_text()) if values else {}
    if values_doc.get("clusterWide"):
        assert kwargs["clusterwide"] is True
    else:
        assert kwargs["namespaces"] == values_doc.get("watchNamespaces", ["fleettune"])
    assert kwargs["liveness_endpoint"] == "http://0.0.0.0:8081/healthz"
    if values_doc.get("metrics", {}).get("enabled", True):
        assert served and served[0][1] == 8080, "the chart's metrics Service expects the operator on :8080"
    else:
        assert not served
    assert kwargs["peering_name"] == (values_doc.get("peering", {}).get("name") if "peering" in values_doc else None)
