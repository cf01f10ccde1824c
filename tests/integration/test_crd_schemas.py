"""The TuningRun CRD on the real API server:

* the schemas of the Kubernetes types the spec embeds (a target's `affinity`,
  `tolerations`) are the live kube-apiserver's own, from its /openapi/v3/api/v1;
* a typo under them is rejected by a strict server-side dry-run (before, the free-form
  objects kept it and the trial Pods silently lost the rule), and a valid one is kept;
* `status.conditions` is a map keyed by type, its times are RFC 3339 date-times.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleettune import GROUP, PLURAL, VERSION
from fleettune.api import kubernetes
from fleettune.crd import KUBERNETES_TYPES, kubernetes_schema

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run_doc(namespace: str, name: str, **target: Any) -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "examples" / "convolution-fleet.yaml").read_text())
    run = copy.deepcopy(next(d for d in docs if d and d.get("kind") == "TuningRun"))
    run["apiVersion"] = f"{GROUP}/{VERSION}"
    run["metadata"] = {"name": name, "namespace": namespace}
    run["spec"]["targets"] = [run["spec"]["targets"][0] | target]
    return run


def dry_run(cluster: Any, doc: dict[str, Any]) -> tuple[int, str]:
    """A server-side apply, dry run (strict: an unknown field is an error, as for Flux and Argo CD)."""
    proc = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=test", "-o", "json",
                           "-f", "-", input=json.dumps(doc), check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_shipped_kubernetes_schemas_are_the_live_api_servers(cluster: Any) -> None:
    live = json.loads(cluster.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    for var, type_name in KUBERNETES_TYPES.items():
        assert kubernetes_schema(live, type_name) == getattr(kubernetes, var), (
            f"{type_name} changed in the API server: `kubectl get --raw /openapi/v3/api/v1 > openapi.json && "
            "fleettune crd --kubernetes-openapi openapi.json > operator/fleettune/api/kubernetes.json`, then "
            "regenerate the CRD"
        )


NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
        }
    }
}


@pytest.mark.parametrize(
    ("target", "field"),
    [
        ({"affinity": {"nodeAfinity": NODE_AFFINITY["nodeAffinity"]}}, "affinity.nodeAfinity"),
        ({"affinity": json.loads(json.dumps(NODE_AFFINITY).replace("matchExpressions", "matchExpresions"))},
         "nodeSelectorTerms[0].matchExpresions"),
        ({"tolerations": [{"key": "gpu", "operator": "Exists", "efect": "NoSchedule"}]}, "tolerations[0].efect"),
    ],
    ids=["affinity", "nested", "toleration"],
)
def test_a_typo_under_affinity_or_tolerations_is_rejected(cluster: Any, crd: None, namespace: str,
                                                         target: dict[str, Any], field: str) -> None:
    code, out = dry_run(cluster, run_doc(namespace, "typo", **target))
    assert code != 0 and field in out and "field not declared in schema" in out, out


def test_values_outside_the_kubernetes_schema_are_rejected(cluster: Any, crd: None, namespace: str) -> None:
    code, out = dry_run(cluster, run_doc(namespace, "enum", tolerations=[{"key": "gpu", "effect": "NoScheduel"}]))
    assert code != 0 and "NoScheduel" in out and "Unsupported value" in out, out
    missing = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "values": ["a"]}]}]}}}  # no operator
    code, out = dry_run(cluster, run_doc(namespace, "required", affinity=missing))
    assert code != 0 and "operator" in out and "Required value" in out, out


def test_valid_affinity_and_tolerations_are_kept_as_written(cluster: Any, crd: None, namespace: str) -> None:
    tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "edge", "operator": "Equal", "value": "true", "effect": ""},  # "": every effect
        {"key": "drain", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    ]
    affinity = {**NODE_AFFINITY, "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": {"app": "x"}}}}]}}
    code, out = dry_run(cluster, run_doc(namespace, "valid", affinity=affinity, tolerations=tolerations))
    assert code == 0, out
    target = json.loads(out)["spec"]["targets"][0]
    assert target["affinity"] == affinity and target["tolerations"] == tolerations


def test_conditions_are_a_map_by_type_with_rfc3339_times(cluster: Any, crd: None, namespace: str,
                                                        api_client: Any) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run_doc(namespace, "conds"))

    def write(conditions: list[dict[str, Any]]) -> client.ApiException | None:
        try:
            api.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, "conds", {"status": {"conditions": conditions}}, dry_run="All"
            )
        except client.ApiException as exc:
            return exc
        return None

    ready = {"type": "Ready", "status": "False", "reason": "Tuning", "lastTransitionTime": "2025-01-02T03:04:05Z"}
    assert write([ready, {**ready, "type": "Stalled"}]) is None
    duplicate = write([ready, {**ready, "status": "True"}])
    assert duplicate is not None and duplicate.status == 422 and "Duplicate value" in duplicate.body
    bad_time = write([{**ready, "lastTransitionTime": "yesterday"}])
    assert bad_time is not None and bad_time.status == 422 and "date-time" in bad_time.body
