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
from chart_support import CHART, VALUES, Helm

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


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_default_memory_is_set_from_the_measurement(chart: Helm) -> None:
    """`fleettune bench memory` (docs/memory.md): the largest run measured, 24 targets over
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
    args = container(docs)["args"]
    assert "--all-namespaces" in args and "--verbose" in args
    assert not [a for a in args if a.startswith("--namespace")]


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
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["fleettune"]
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert json.loads(cm["data"]["fleettune.json"]) == json.loads((CHART / "dashboards" / "fleettune.json").read_text())


def test_minimal(chart: Helm) -> None:
    docs = chart.template("minimal.yaml")
    assert not by_kind(docs, "Service") and not by_kind(docs, "ConfigMap") and not by_kind(docs, "ServiceAccount")
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


def test_chart_files_are_tracked_by_path() -> None:
    # The CRD is a template now: a copy left in crds/ would be installed twice.
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["kopf-peering.yaml"]
    assert Path(CHART / "templates" / "NOTES.txt").exists()


@pytest.mark.parametrize("values", ["", *VALUE_FILES])
def test_deployment_args_are_accepted_by_the_operator_cli(
    chart: Helm, values: str, monkeypatch: pytest.MonkeyPatch
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
