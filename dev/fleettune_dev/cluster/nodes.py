"""The fleet's fake GPU nodes on a running control plane: kwok's CRDs, the nodes and the
GPU RuntimeClass created, their readiness awaited, and listed by pool. Each function takes
a kubernetes ApiClient; `LocalCluster` calls them as it comes up and for its status.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fleettune.labels import POOL_LABEL
from fleettune_dev.cluster.binaries import Binaries
from fleettune_dev.cluster.components import ClusterError
from fleettune_dev.cluster.fleet import GPU_RESOURCE, Fleet

RUNTIME_CLASS = "nvidia"


def install_kwok_crds(api: Any, bins: Binaries) -> None:
    """kwok's CRDs, among them `Logs`: the fleet simulator points each batch Pod's log at a
    file (`fleettune_dev.sim.podlogs`), which kwok serves to `kubectl logs` and the operator."""
    from kubernetes import client

    crds = client.ApiextensionsV1Api(api)
    for path in sorted((bins.kwok.parent / "crds").glob("*.yaml")):
        try:
            crds.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        except client.ApiException as exc:
            if exc.status != 409:
                raise


def ensure_fleet(api: Any, fleet: Fleet, say: Callable[[str], None], kwok_log: Path,
                 timeout: float = 60.0) -> None:
    """Create the fleet's missing nodes and the GPU RuntimeClass, then wait until every node
    of the fleet is Ready (`is_ready`); ``kwok_log`` is named when they are not."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    existing = {n.metadata.name for n in core.list_node().items}
    wanted = fleet.node_manifests()
    created = 0
    for manifest in wanted:
        if manifest["metadata"]["name"] not in existing:
            core.create_node(manifest)
            created += 1
    node_api = client.NodeV1Api(api)
    try:
        node_api.create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                       "metadata": {"name": RUNTIME_CLASS}, "handler": RUNTIME_CLASS})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    names = {m["metadata"]["name"] for m in wanted}
    if created:
        say(f"created {created} fake GPU node(s) in pools {', '.join(fleet.pool_names())}")
    deadline = time.monotonic() + timeout
    while True:
        nodes = core.list_node(label_selector=POOL_LABEL).items
        ready = {n.metadata.name for n in nodes if is_ready(n)}
        if names <= ready:
            break
        if time.monotonic() > deadline:
            raise ClusterError(f"nodes not Ready after {timeout:.0f}s: {sorted(names - ready)}; "
                               f"see {kwok_log}")
        time.sleep(0.3)
    say(f"{len(names)} node(s) Ready")


def nodes_by_pool(api: Any) -> dict[str, list[dict[str, Any]]]:
    """The fleet's nodes by pool: name, readiness, GPUs and architecture (`fleettune cluster status`)."""
    from kubernetes import client

    nodes = client.CoreV1Api(api).list_node(label_selector=POOL_LABEL, _request_timeout=5).items
    pools: dict[str, list[dict[str, Any]]] = {}
    for n in sorted(nodes, key=lambda n: n.metadata.name):
        pools.setdefault(n.metadata.labels[POOL_LABEL], []).append({
            "name": n.metadata.name,
            "ready": is_ready(n),
            "gpus": (n.status.allocatable or {}).get(GPU_RESOURCE),
            "arch": n.metadata.labels.get("kubernetes.io/arch"),
        })
    return pools


def is_ready(node: Any) -> bool:
    """Whether the scheduler places Pods on ``node`` (a client model): Ready, no lifecycle taint."""
    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    # The node lifecycle controller taints new nodes not-ready until it has seen them Ready;
    # the scheduler honours the taint, so a node is usable only once it is gone.
    lifecycle = [t for t in (node.spec.taints or []) if t.key.startswith("node.kubernetes.io/")]
    return ready and not lifecycle
