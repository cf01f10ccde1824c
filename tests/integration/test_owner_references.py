"""Trial Jobs are admitted with the chart's RBAC alone, on an apiserver that enforces
owner-reference permissions (OwnerReferencesPermissionEnforcement, on in OpenShift).

The Jobs block their TuningRun's deletion (`blockOwnerDeletion`), which the admission
plugin allows only to a user who may update the run's finalizers: the check runs the
operator's own rendering of a Job through the real admission chain (a server-side
dry-run as the chart's ServiceAccount)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from test_chart import helm, render, tuningrun_crd  # noqa: F401  (fixtures)

from fleettune import GROUP, PLURAL, VERSION
from fleettune.api import TuningRunSpec
from fleettune.jobs import render_job

ROOT = Path(__file__).resolve().parents[2]


def test_a_trial_job_is_admitted_with_the_charts_rbac_under_owner_reference_enforcement(
    cluster: Any, namespace: str, helm: Path, tuningrun_crd: None, api_client: Any, tmp_path: Path  # noqa: F811
) -> None:
    from kubernetes import client

    release = f"or{namespace[-6:]}"
    manifest = render(helm, release, namespace, "--show-only", "templates/rbac.yaml",
                      "--show-only", "templates/serviceaccount.yaml")
    (tmp_path / "rbac.yaml").write_text(manifest)
    cluster.kubectl("apply", "-f", str(tmp_path / "rbac.yaml"))
    try:
        doc = yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())
        doc["metadata"] = {"name": "owned"}
        run = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, doc)
        spec = TuningRunSpec.model_validate(doc["spec"])
        job = render_job(run="owned", namespace=namespace, uid=run["metadata"]["uid"], spec=spec,
                         target=spec.targets[0], index=0,
                         configs=[(dict(spec.kernel.default_config or {}), "default")], pin={}, node_expressions=[],
                         key="a100",
                         problem_size=tuple(spec.kernel.sizes()[0]), source_digest=None)
        assert job["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
        path = tmp_path / "job.json"
        path.write_text(json.dumps(job))
        sa = f"system:serviceaccount:{namespace}:{release}-fleettune"
        admitted = cluster.kubectl("create", "--dry-run=server", f"--as={sa}", "-f", str(path), check=False)
        assert admitted.returncode == 0, admitted.stderr

        # The plugin is really on: a user who may create Jobs but not update the run's
        # finalizers is refused the same Job.
        creator = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": "jobs-only", "namespace": namespace},
                   "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]}
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "jobs-only", "namespace": namespace},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "jobs-only"},
                   "subjects": [{"kind": "User", "name": "jobs-only", "apiGroup": "rbac.authorization.k8s.io"}]}
        (tmp_path / "role.yaml").write_text(yaml.safe_dump_all([creator, copy.deepcopy(binding)]))
        cluster.kubectl("apply", "-f", str(tmp_path / "role.yaml"))
        refused = cluster.kubectl("create", "--dry-run=server", "--as=jobs-only", "-f", str(path), check=False)
        assert refused.returncode != 0 and "blockOwnerDeletion" in refused.stderr, refused.stderr
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", str(tmp_path / "rbac.yaml"))
