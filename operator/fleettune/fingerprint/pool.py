"""Which nodes count, and the fingerprint of a pool of them (pure).

Nodes in the middle of a GPU-operator driver upgrade, cordoned nodes and shared GPUs
(time-slicing, MPS: no isolation, so their timings are not valid for tuning) are not
*eligible*: they neither define the pool's fingerprint (`PoolFingerprint`) nor should run
trials. A pool's results are *stale* (`fleettune.fingerprint.model.is_stale`) when the
fingerprint they were tuned for differs from the pool's current one in a field that changes
timings. While a driver rollout leaves the pool mixed, trials are pinned to one driver stack
(`pinning_selector`); `eligibility_affinity` keeps trial Pods off ineligible nodes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleettune.fingerprint.model import GpuFingerprint, fingerprint_key
from fleettune.fingerprint.node import (
    FT_DRIVER,
    FT_L4T,
    GFD_DRIVER,
    GFD_SHARING,
    UPGRADE_DONE,
    UPGRADE_STATE,
    node_fingerprint,
)


class PoolFingerprint(BaseModel):
    """The fingerprint of a pool's eligible nodes.

    ``fingerprint`` is the one most eligible nodes have (ties: the newest driver, so a
    rollout that reached half the pool already counts as upgraded). ``mixed`` is True
    while eligible nodes disagree — a driver rollout in progress: the controller should
    not start a re-tune until the pool is uniform again, since trials could land on
    either driver.
    """

    model_config = ConfigDict(frozen=True)

    fingerprint: GpuFingerprint
    eligible: int
    total: int
    mixed: bool = False
    variants: dict[str, int] = Field(default_factory=dict)  # fingerprint_key -> eligible nodes
    skipped: dict[str, int] = Field(default_factory=dict)  # reason -> nodes


def node_eligible(
    labels: Mapping[str, str], unschedulable: bool = False, allow_shared: bool = False
) -> tuple[bool, str]:
    """Whether trials may run on (and timings may be taken from) this node, and why not."""
    state = labels.get(UPGRADE_STATE, "")
    if state and state != UPGRADE_DONE:
        # Anything from upgrade-required to upgrade-failed: the driver is about to change,
        # is changing, or is broken.
        return False, f"driver upgrade in progress ({state})"
    if unschedulable:
        return False, "cordoned"
    fp = node_fingerprint(labels)
    if not fp.known:
        return False, "no GPU labels"
    if fp.shared and not allow_shared:
        return False, f"GPU shared ({fp.sharing}, {fp.replicas} replicas)"
    return True, ""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def pool_fingerprint(
    nodes: Iterable[tuple[Mapping[str, str], bool]], allow_shared: bool = False
) -> PoolFingerprint | None:
    """The fingerprint of the eligible nodes among ``(labels, unschedulable)``; None when
    no node is eligible (then nothing can be said: keep the previous one)."""
    fps: list[GpuFingerprint] = []
    skipped: Counter[str] = Counter()
    total = 0
    for labels, unschedulable in nodes:
        total += 1
        ok, reason = node_eligible(labels, unschedulable, allow_shared)
        if ok:
            fps.append(node_fingerprint(labels))
        else:
            skipped[reason.split(" (")[0]] += 1
    if not fps:
        return None
    # Nodes of one pool agree on what matters but may differ in fields that do not
    # (memory of a sibling SKU, an arch label): group by the stale-relevant part only.
    groups: dict[tuple[str, ...], list[GpuFingerprint]] = {}
    for fp in fps:
        groups.setdefault(fp.stale_part(), []).append(fp)
    winner = max(groups.values(), key=lambda g: (len(g), _version(g[0].driver_version),
                                                 _version(g[0].cuda_runtime_version), fingerprint_key(g[0])))
    return PoolFingerprint(
        fingerprint=winner[0],
        eligible=len(fps),
        total=total,
        mixed=len(groups) > 1,
        variants={fingerprint_key(g[0]): len(g) for g in groups.values()},
        skipped=dict(sorted(skipped.items())),
    )


def pinning_selector(fp: GpuFingerprint) -> dict[str, str]:
    """Node-selector labels that keep trials on nodes with this driver stack (e.g. while a
    rollout leaves a pool mixed); merged into the target's own selector, which already
    picks the product."""
    if fp.source == "fleettune":
        pins = {FT_DRIVER: fp.driver_version, FT_L4T: fp.l4t_version}
    elif fp.source == "gfd":
        pins = {GFD_DRIVER: fp.driver_version}
    else:
        return {}
    return {k: v for k, v in pins.items() if v}


# The GPU operator's upgrade states before "upgrade-done" (and its failure state).
UPGRADE_IN_PROGRESS = (
    "upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
    "pod-restart-required", "validation-required", "uncordon-required", "upgrade-failed",
)


def eligibility_affinity(allow_shared: bool = False) -> list[dict[str, Any]]:
    """Node-affinity match expressions that keep trial Pods off ineligible nodes (to be
    added to every term of the target's required node affinity). ``NotIn`` also matches
    nodes without the label, which is what an un-upgraded, unshared node looks like.
    Cordoned nodes need nothing: the scheduler already skips them."""
    out: list[dict[str, Any]] = [{"key": UPGRADE_STATE, "operator": "NotIn", "values": list(UPGRADE_IN_PROGRESS)}]
    if not allow_shared:
        out.append({"key": GFD_SHARING, "operator": "NotIn", "values": ["time-slicing", "mps"]})
    return out
