"""The Helm chart against the real API server: every rendered object passes a server-side
dry-run (the API server's own schemas, the ServiceMonitor's and PrometheusRule's CRDs
included), a real `helm install` with the longest release name Helm allows, the RBAC grants
exactly what the operator calls, and `fleettune report` reads a run from the cluster.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from fleettune.results import TrialRecord
from fleettune.rollup import run_status, target_status
from fleettune.store import ResultsStore
from fleettune_dev.cluster.binaries import _go_env, ensure_helm
from fleettune_job.protocol import Fingerprint, Outcome

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fleettune"
VALUES = ROOT / "tests" / "unit" / "chart" / "values"
# The ServiceMonitor CRD as the Prometheus Operator publishes it (a Go module: fetched
# through the module proxy and cached by Go like the control plane's sources).
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
MONITORING_CRDS = {
    f"{plural}.monitoring.coreos.com": f"example/prometheus-operator-crd/monitoring.coreos.com_{plural}.yaml"
    for plural in ("servicemonitors", "prometheusrules")
}
FIELD_MANAGER = "fleettune-chart-test"
# Helm's longest release name: every name the chart derives from it must fit in 63 characters.
LONG_RELEASE = "a-release-name-of-fifty-three-characters-for-the-test"


def _say(msg: str) -> None:
    (sys.__stderr__ or sys.stderr).write(f"[helm] {msg}\n")


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_helm(_say)


@pytest.fixture(scope="module")
def foreign_crds(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """CRDs that the chart's objects need to exist: the Prometheus Operator's and kopf's peering ones."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", PROMETHEUS_OPERATOR], capture_output=True, text=True, env=_go_env(),
        cwd=tmp_path_factory.mktemp("gomod"), timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    module = Path(json.loads(out.stdout)["Dir"])
    for path in (*(module / crd for crd in MONITORING_CRDS.values()), CHART / "crds" / "kopf-peering.yaml"):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                        "-f", str(path))
    cluster.wait_established(*MONITORING_CRDS, "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")


@pytest.fixture(scope="module")
def tuningrun_crd(cluster: Any, helm: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The TuningRun CRD as the chart installs it (applied for real: RBAC checks and runs need the kind)."""
    path = tmp_path_factory.mktemp("crd") / "crd.yaml"
    path.write_text(render(helm, "ft", "default", "--show-only", "templates/crds.yaml"))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", str(path))
    cluster.wait_established("tuningruns.fleettune.dev")


def render(helm: Path, release: str, namespace: str, *args: str) -> str:
    proc = subprocess.run(
        [str(helm), "template", release, str(CHART), "--namespace", namespace, *args],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("values", ["default", *sorted(p.stem for p in VALUES.glob("*.yaml"))])
def test_rendered_objects_pass_server_side_dry_run(
    cluster: Any, namespace: str, helm: Path, foreign_crds: None, tmp_path: Path, values: str
) -> None:
    args = [] if values == "default" else ["-f", str(VALUES / f"{values}.yaml")]
    # Objects go to namespaces that exist: the test's own.
    args += ["--set", f"watchNamespaces={{{namespace}}}", "--set", f"dashboard.namespace={namespace}",
             "--set", f"trialNetworkPolicy.namespaces={{{namespace}}}", "--include-crds"]
    manifest = render(helm, LONG_RELEASE, namespace, *args)
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    path = tmp_path / "chart.yaml"
    path.write_text(manifest)
    out = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
        "-f", str(path),
    ).stdout
    applied = [line for line in out.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(docs), out
    kinds = {d["kind"] for d in docs}
    assert "ServiceMonitor" not in kinds or "servicemonitor.monitoring.coreos.com" in out
    assert "PrometheusRule" not in kinds or "prometheusrule.monitoring.coreos.com" in out
    assert "networkpolicy.networking.k8s.io" in out  # trial Pods are cut off by default


def test_helm_install_with_the_longest_release_name(
    cluster: Any, namespace: str, helm: Path, foreign_crds: None, tuningrun_crd: None
) -> None:
    """A real `helm install` (release names of 45-53 characters broke it, on a
    Service name over 63 characters), with monitoring, alerts and the trial NetworkPolicy."""
    base = [str(helm), "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace]
    install = subprocess.run(
        [*base, "install", LONG_RELEASE, str(CHART), "-f", str(VALUES / "monitoring.yaml"),
         "--set", f"watchNamespaces={{{namespace}}}", "--set", f"dashboard.namespace={namespace}",
         # The CRD is the tuningrun_crd fixture's: a second owner would be refused.
         "--set", "crds.install=false", "--set", "replicaCount=0"],
        capture_output=True, text=True, timeout=300,
    )
    try:
        assert install.returncode == 0, install.stderr
        manifest = subprocess.run([*base, "get", "manifest", LONG_RELEASE], capture_output=True, text=True,
                                  timeout=60, check=True).stdout
        docs = [d for d in yaml.safe_load_all(manifest) if d]
        assert {"Service", "Deployment", "ServiceMonitor", "PrometheusRule", "NetworkPolicy", "ClusterRole"} <= {
            d["kind"] for d in docs}
        for d in docs:
            assert len(d["metadata"]["name"]) <= 63, d["metadata"]["name"]
            scope = ["-n", d["metadata"].get("namespace", namespace)] if d["kind"] not in {
                "ClusterRole", "ClusterRoleBinding"} else []
            got = cluster.kubectl("get", d["kind"].lower(), d["metadata"]["name"], *scope, "-o", "name", check=False)
            assert got.returncode == 0, f"{d['kind']} {d['metadata']['name']}: {got.stderr}"
    finally:
        subprocess.run([*base, "uninstall", LONG_RELEASE, "--wait", "--timeout", "120s"], capture_output=True,
                       text=True, timeout=180)


def test_notes_tell_what_to_do_next(cluster: Any, namespace: str, helm: Path, foreign_crds: None) -> None:
    # NOTES.txt is only rendered by `helm install`; a dry-run against the real server renders it.
    proc = subprocess.run(
        [str(helm), "install", "ft", str(CHART), "--dry-run=server", "--namespace", namespace,
         "--kubeconfig", str(cluster.kubeconfig), "-f", str(VALUES / "monitoring.yaml"),
         "--set", f"dashboard.namespace={namespace}", "--set", "crds.install=false"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {namespace} rollout status deploy/ft-fleettune" in notes
    assert f"kubectl -n {namespace} apply -f" in notes and "fleettune report" in notes
    assert "ServiceMonitor is installed" in notes and '{"release":"kube-prometheus-stack"}' in notes
    assert "Argo CD" in notes


def test_dry_run_catches_a_broken_object(cluster: Any, namespace: str, tmp_path: Path) -> None:
    """The dry-run does validate: a Deployment with a misspelt field is refused by the server."""
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad", "namespace": namespace},
           "spec": {"replicas": "two", "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}},
                                 "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", str(path), check=False)
    assert proc.returncode != 0


def _can(cluster: Any, sa: str, verb: str, resource: str, namespace: str | None) -> bool:
    args = ["-n", namespace] if namespace else []
    if "/" in resource:
        resource, sub = resource.split("/")
        args.append(f"--subresource={sub}")
    proc = cluster.kubectl("auth", "can-i", verb, resource, f"--as={sa}", *args, check=False)
    assert "doesn't have a resource type" not in proc.stderr, proc.stderr  # a "no" that proves nothing
    return proc.stdout.strip() == "yes"


def test_namespaced_rbac_grants_exactly_the_operators_calls(
    cluster: Any, namespace: str, helm: Path, tuningrun_crd: None, tmp_path: Path
) -> None:
    release = f"rb{namespace[-6:]}"  # ClusterRoles are cluster-wide: one name per test namespace
    manifest = render(helm, release, namespace, "--show-only", "templates/rbac.yaml",
                      "--show-only", "templates/serviceaccount.yaml")
    path = tmp_path / "rbac.yaml"
    path.write_text(manifest)
    cluster.kubectl("apply", "-f", str(path))
    try:
        account = next(d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "ServiceAccount")
        sa = f"system:serviceaccount:{namespace}:{account['metadata']['name']}"
        allowed = [
            ("watch", "tuningruns.fleettune.dev"), ("patch", "tuningruns.fleettune.dev/status"),
            # blockOwnerDeletion on trial Jobs, under OwnerReferencesPermissionEnforcement.
            ("update", "tuningruns.fleettune.dev/finalizers"),
            ("create", "jobs.batch"), ("delete", "jobs.batch"), ("list", "pods"), ("watch", "pods"),
            ("create", "configmaps"), ("update", "configmaps"), ("create", "events"), ("patch", "events"),
        ]
        for verb, resource in allowed:
            assert _can(cluster, sa, verb, resource, namespace), f"cannot {verb} {resource}"
        assert _can(cluster, sa, "list", "nodes", None)
        denied = [
            ("get", "secrets", namespace), ("delete", "configmaps", namespace), ("delete", "pods", namespace),
            ("create", "tuningruns.fleettune.dev", namespace), ("delete", "tuningruns.fleettune.dev", namespace),
            ("update", "tuningruns.fleettune.dev", namespace),  # only the finalizers subresource
            ("create", "jobs.batch", "default"),  # a namespace it does not watch
            ("patch", "nodes", None), ("create", "customresourcedefinitions.apiextensions.k8s.io", None),
        ]
        for verb, resource, ns in denied:
            assert not _can(cluster, sa, verb, resource, ns), f"may {verb} {resource} in {ns}"
    finally:
        # The ClusterRole and its binding outlive the namespace (their names are hashed past 63 characters).
        cluster.kubectl("delete", "--ignore-not-found", "-f", str(path))


def test_report_reads_a_run_from_the_cluster(
    cluster: Any, namespace: str, api_client: Any, tuningrun_crd: None, tmp_path: Path
) -> None:
    from fleettune import GROUP, PLURAL, VERSION
    from fleettune.commands.report import main

    run = yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())
    run["metadata"] = {"name": "reported", "namespace": namespace}
    custom = client.CustomObjectsApi(api_client)
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run)
    target = run["spec"]["targets"][0]["name"]
    fp = Fingerprint(product="NVIDIA A100-SXM4-40GB", simulated=True)
    records = [
        TrialRecord(target=target, index=i, config={"i": i}, key=f"i={i}", outcome=o, objective=ms, fingerprint=fp)
        for i, (o, ms) in enumerate([(Outcome.OK, 2.0), (Outcome.COMPILE_ERROR, None), (Outcome.OK, 0.75)])
    ]
    ResultsStore(client.CoreV1Api(api_client), namespace, "reported", created["metadata"]["uid"]).append(records)
    ts = target_status(name=target, phase="Running", budget=10, records=records, running=1, device="A100")
    status = run_status(previous=None, generation=1, phase="Running", targets=[ts], results=None,
                        reason="Tuning", message="1 trials running")
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "reported",
        {"status": status.model_dump(by_alias=True, exclude_none=True, mode="json")},
    )
    html = tmp_path / "r.html"
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["reported", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig), "--html", str(html)])
    assert rc == 0
    line = next(line for line in out.getvalue().splitlines() if target in line)
    assert re.search(r"\b2\b.*\b1\b.*0\.75 ms", line), line  # 2 valid, 1 invalid, best 0.75 ms
    assert "0.75 ms" in html.read_text() and "data:image/png;base64," in html.read_text()
    missing = main(["absent", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig), "--no-file"])
    assert missing == 1
