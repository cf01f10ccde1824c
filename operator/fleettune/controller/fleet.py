"""A pool's nodes as the operator sees them: which match its target, what GPU they carry (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleettune.api import TargetSpec
from fleettune.controller.lifecycle import PoolPhase
from fleettune.controller.pool import Pool, iso_time
from fleettune.fingerprint import FT_PRODUCT, GFD_PRODUCT, PoolFingerprint, node_eligible, pool_fingerprint

PRODUCT_LABELS = (GFD_PRODUCT, FT_PRODUCT)

Node = tuple[Mapping[str, str], bool]  # (labels, unschedulable)
GPU_RESOURCE = "nvidia.com/gpu"  # what each trial Pod requests `targets[].gpus` of (`jobs.render_job`)


def allocatable_gpus(node: Mapping[str, Any]) -> int | None:
    """The GPUs a node offers to Pods (status.allocatable); None when it does not say (no
    device plugin reporting yet, or a body without its status)."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
    try:
        return max(0, int(str(value))) if value is not None else None
    except ValueError:  # a quantity such as "1k" is not a GPU count a device plugin reports
        return None


def capacity_note(parallelism: int, gpus: int, per_pod: int, pods: int) -> str:
    """The pool's message when its parallelism asks for more trial Pods than its GPUs run at once."""
    each = f" ({per_pod} per trial Pod)" if per_pod > 1 else ""
    return f"parallelism {parallelism} exceeds the pool's {gpus} GPUs{each}: {max(pods, 1)} at a time"


def matching_nodes(nodes: Mapping[str, Node], target: TargetSpec) -> list[Node] | None:
    """The target's nodes by its node selector; None when it selects by affinity only
    (which the operator does not evaluate: the scheduler does)."""
    if not target.node_selector:
        return None
    want = target.node_selector.items()
    return [(labels, cordoned) for labels, cordoned in nodes.values() if all(labels.get(k) == v for k, v in want)]


def current_fingerprint(nodes: list[Node] | None, target: TargetSpec) -> PoolFingerprint | None:
    return pool_fingerprint(nodes, allow_shared=target.allow_shared_gpus) if nodes else None


def product_of(pool: Pool, nodes: list[Node] | None) -> str | None:
    if pool.spec.device:
        return pool.spec.device
    if pool.current is not None and pool.current.fingerprint.product:
        return pool.current.fingerprint.product
    for labels, _ in nodes or []:
        for key in PRODUCT_LABELS:
            if labels.get(key):
                return labels[key]
    # No node yet (a pool scaled to zero): the product its node selector asks for.
    selector = pool.spec.node_selector or {}
    return next((selector[key] for key in PRODUCT_LABELS if selector.get(key)), None)


def compute_capability(pool: Pool) -> str | None:
    """The pool's GPU architecture: from its nodes' labels, else from the device catalog."""
    if pool.current is not None and pool.current.fingerprint.compute_capability:
        return pool.current.fingerprint.compute_capability
    from fleettune.space import SpaceError, lookup_device

    try:
        return lookup_device(pool.device).cc if pool.device and pool.device != "unknown" else None
    except SpaceError:
        return None


NODES_MAX_AGE_S = 15.0
# A pool scaled to zero: how long it waits for a node, and how many trials it keeps pending.
DEFAULT_NODE_WAIT_S = 600.0
PENDING_WITHOUT_NODES = 1


def waits_for_nodes(pool: Pool, selector: str, wall: float, node_wait_s: float) -> bool:
    """Whether a pool none of whose nodes exist (scaled to zero) tunes on, keeping a trial
    pending so that a cluster autoscaler sees a Pod to add a node for, until `node_wait_s`
    has passed; says so in its message. Only when its GPU is known (`targets[].device`, or
    a product label in its node selector): the search space needs the device's limits."""
    if node_wait_s <= 0 or product_of(pool, None) is None:
        return False
    since = pool.nodes_missing_since = pool.nodes_missing_since or wall
    until = since + node_wait_s
    if wall >= until:
        return False
    message = (f"no node matches {selector} yet: {PENDING_WITHOUT_NODES} trial kept pending for a "
               f"cluster autoscaler, until {iso_time(until)}")
    if pool.phase == PoolPhase.UNSCHEDULABLE:
        pool.move(PoolPhase.RUNNING, message)
    else:  # Pending keeps it when its search is built
        pool.message = message
    return True


class FleetView:
    """The cluster's nodes as last read, and each target's share of them.

    Read again when a node event that matters bumped the epoch (driver upgrades, cordons,
    new or lost nodes), or when the copy is older than NODES_MAX_AGE_S."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.gpus: dict[str, int] = {}  # node name -> allocatable GPUs, of those that say
        self.version: tuple[int, float] | None = None  # (epoch, monotonic time) of the read
        # Per target: its nodes and fingerprint, until the nodes are read again (the sizes
        # of a target, and every step in between, share them).
        self.views: dict[str, tuple[list[Node] | None, PoolFingerprint | None]] = {}

    def wants(self, epoch: int, mono: float) -> bool:
        return self.version is None or self.version[0] != epoch or mono - self.version[1] >= NODES_MAX_AGE_S

    def accept(self, nodes: Iterable[Mapping[str, Any]], epoch: int, mono: float) -> None:
        nodes = list(nodes)
        self.nodes = {
            n["metadata"]["name"]: (n["metadata"].get("labels") or {}, bool(n.get("spec", {}).get("unschedulable")))
            for n in nodes
        }
        self.gpus = {n["metadata"]["name"]: gpus for n in nodes if (gpus := allocatable_gpus(n)) is not None}
        self.version = (epoch, mono)
        self.views.clear()

    def capacity(self, target: TargetSpec) -> tuple[int, int] | None:
        """(GPUs, trial Pods) the target's schedulable nodes run at once: their allocatable
        GPUs, and how many Pods of `target.gpus` GPUs each fit on them. None when it is not
        known: the target selects by affinity only, or none of its nodes reports its GPUs
        (then the scheduler, not the operator, bounds what runs)."""
        if not target.node_selector:
            return None
        want = target.node_selector.items()
        gpus = pods = 0
        known = False
        for name, (labels, cordoned) in self.nodes.items():
            if not all(labels.get(k) == v for k, v in want) or not node_eligible(
                    labels, cordoned, target.allow_shared_gpus)[0]:
                continue
            if (free := self.gpus.get(name)) is not None:
                known = True
                gpus += free
                pods += free // target.gpus
        return (gpus, pods) if known else None

    def of(self, target: TargetSpec) -> tuple[list[Node] | None, PoolFingerprint | None]:
        """The target's nodes (None: it selects by affinity only) and their fingerprint."""
        view = self.views.get(target.name)
        if view is None:
            nodes = matching_nodes(self.nodes, target)
            view = self.views[target.name] = (nodes, current_fingerprint(nodes, target))
        return view
