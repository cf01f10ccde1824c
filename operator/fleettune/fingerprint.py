"""Node and pool fingerprints: what a pool's GPUs are, read from node labels (pure).

A fingerprint says what a result was measured on: GPU product, compute capability,
driver and CUDA versions, MIG profile and sharing mode (and, on Jetson, the L4T
release). It comes from GPU Feature Discovery labels (``nvidia.com/...``) or, on Jetson
nodes where GFD does not run, from the project's own ``fleettune.dev/...`` labels.

A pool's results are *stale* when the fingerprint they were tuned for differs from
the pool's current one in a field that changes timings (`STALE_FIELDS`). Nodes in the
middle of a GPU-operator driver upgrade, cordoned nodes and shared GPUs (time-slicing,
MPS: no isolation, so their timings are not valid for tuning) are not *eligible*: they
neither define the pool's fingerprint nor should run trials.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Sharing = Literal["none", "time-slicing", "mps"]

NV = "nvidia.com/"
FT = "fleettune.dev/"

# GPU Feature Discovery.
GFD_PRODUCT = NV + "gpu.product"
GFD_FAMILY = NV + "gpu.family"
GFD_MEMORY = NV + "gpu.memory"
GFD_CC_MAJOR = NV + "gpu.compute.major"
GFD_CC_MINOR = NV + "gpu.compute.minor"
GFD_DRIVER = NV + "cuda.driver-version.full"
GFD_DRIVER_OLD = (NV + "cuda.driver.major", NV + "cuda.driver.minor", NV + "cuda.driver.rev")  # deprecated
GFD_RUNTIME = NV + "cuda.runtime-version.full"
GFD_RUNTIME_OLD = (NV + "cuda.runtime.major", NV + "cuda.runtime.minor")  # deprecated
GFD_SHARING = NV + "gpu.sharing-strategy"
GFD_REPLICAS = NV + "gpu.replicas"
GFD_MIG_STRATEGY = NV + "mig.strategy"
GFD_TIMESTAMP = NV + "gfd.timestamp"  # changes on every relabel: never relevant
# GPU operator's driver upgrade controller.
UPGRADE_STATE = NV + "gpu-driver-upgrade-state"
UPGRADE_DONE = "upgrade-done"
# The project's labels for nodes GFD does not label (Jetson).
FT_PRODUCT = FT + "gpu.product"
FT_CC_MAJOR = FT + "gpu.compute.major"
FT_CC_MINOR = FT + "gpu.compute.minor"
FT_DRIVER = FT + "cuda.driver-version.full"
FT_RUNTIME = FT + "cuda.runtime-version.full"
FT_L4T = FT + "jetson.l4t-version"
ARCH = "kubernetes.io/arch"

RELEVANT_LABEL_KEYS: frozenset[str] = frozenset({
    GFD_PRODUCT, GFD_FAMILY, GFD_MEMORY, GFD_CC_MAJOR, GFD_CC_MINOR, GFD_DRIVER, *GFD_DRIVER_OLD,
    GFD_RUNTIME, *GFD_RUNTIME_OLD, GFD_SHARING, GFD_REPLICAS, GFD_MIG_STRATEGY, UPGRADE_STATE,
    FT_PRODUCT, FT_CC_MAJOR, FT_CC_MINOR, FT_DRIVER, FT_RUNTIME, FT_L4T, ARCH,
})
# Under the "mixed" MIG strategy GFD adds per-profile labels: nvidia.com/mig-3g.20gb.count, ...
_MIG_COUNT = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb)\.count$")
_MIG_SUFFIX = re.compile(r"-MIG-(.+)$")
_SHARED_SUFFIX = "-SHARED"

# Fields that change timings: a difference in one of them makes old results stale.
# L4T is Jetson's driver stack (a JetPack upgrade changes kernel, driver and CUDA
# together). Not stale: arch (implied by the product), family/memory (implied by the
# product), sharing/replicas (a scheduling property; shared nodes are not eligible
# unless the target allows it).
STALE_FIELDS = ("product", "compute_capability", "driver_version", "cuda_runtime_version", "mig_profile",
                "l4t_version")
_FIELD_NAMES = {
    "product": "GPU", "compute_capability": "compute capability", "driver_version": "driver",
    "cuda_runtime_version": "CUDA", "mig_profile": "MIG profile", "l4t_version": "L4T",
}


class NodeFingerprint(BaseModel):
    """What a node's GPU is, as its labels say. Empty strings mean "not labelled"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    product: str = ""  # GFD spelling, without -MIG-<profile> / -SHARED suffixes
    compute_capability: str = ""  # "8.0"
    driver_version: str = ""
    cuda_runtime_version: str = ""
    mig_profile: str = ""  # "1g.5gb" (single strategy); "mixed:1g.5gb,3g.20gb"; "" without MIG
    sharing: Sharing = "none"
    replicas: int = 1
    arch: str = ""
    l4t_version: str = ""
    family: str = ""
    memory_mib: int | None = None
    source: Literal["gfd", "fleettune", "device", ""] = ""  # whose labels (or the trial's report)

    @property
    def known(self) -> bool:
        return bool(self.product)

    @property
    def shared(self) -> bool:
        return self.sharing != "none" or self.replicas > 1

    def stale_part(self) -> tuple[str, ...]:
        return tuple(getattr(self, f) for f in STALE_FIELDS)

    def to_status(self) -> dict[str, Any]:
        """camelCase, empty fields left out: for the run's status and the published ConfigMap."""
        out: dict[str, Any] = {}
        for name, value in self.model_dump().items():
            if value in ("", None) or (name == "sharing" and value == "none") or (name == "replicas" and value == 1):
                continue
            out[_camel(name)] = value
        return out

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> NodeFingerprint:
        snake = {_snake(k): v for k, v in data.items()}
        return cls(**{k: v for k, v in snake.items() if k in cls.model_fields})


class PoolFingerprint(BaseModel):
    """The fingerprint of a pool's eligible nodes.

    ``fingerprint`` is the one most eligible nodes have (ties: the newest driver, so a
    rollout that reached half the pool already counts as upgraded). ``mixed`` is True
    while eligible nodes disagree — a driver rollout in progress: the controller should
    not start a re-tune until the pool is uniform again, since trials could land on
    either driver.
    """

    model_config = ConfigDict(frozen=True)

    fingerprint: NodeFingerprint
    eligible: int
    total: int
    mixed: bool = False
    variants: dict[str, int] = Field(default_factory=dict)  # fingerprint_key -> eligible nodes
    skipped: dict[str, int] = Field(default_factory=dict)  # reason -> nodes


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _first(labels: Mapping[str, str], *keys: str) -> str:
    for k in keys:
        v = labels.get(k)
        if v:
            return str(v)
    return ""


def _joined(labels: Mapping[str, str], keys: Sequence[str]) -> str:
    parts = [labels.get(k, "") for k in keys]
    # Deprecated split labels: only trust them when the leading parts are all there.
    while parts and not parts[-1]:
        parts.pop()
    return ".".join(parts) if parts and all(parts) else ""


def _int(text: str | None) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def _catalog_cc(product: str) -> str:
    # Jetson nodes carry no compute-capability label; the device catalog knows the module.
    from fleettune.space.devices import lookup_device
    from fleettune.space.errors import SpaceError

    try:
        return lookup_device(product).cc
    except SpaceError:
        return ""


def node_fingerprint(labels: Mapping[str, str]) -> NodeFingerprint:
    """The fingerprint of one node from its labels (GFD, else the project's Jetson labels)."""
    raw_product = _first(labels, GFD_PRODUCT, FT_PRODUCT)
    product, mig, sharing = raw_product, "", "none"
    m = _MIG_SUFFIX.search(product)
    if m:  # MIG "single": every GPU is split the same way and the product says how
        product, mig = product[: m.start()], m.group(1)
    if product.endswith(_SHARED_SUFFIX):  # device plugin renames shared resources' product
        product, sharing = product[: -len(_SHARED_SUFFIX)], "time-slicing"
    if labels.get(GFD_MIG_STRATEGY) == "mixed":
        profiles = sorted(
            p.group(1) for k, v in labels.items() if (p := _MIG_COUNT.match(k)) and (_int(v) or 0) > 0
        )
        mig = "mixed:" + ",".join(profiles) if profiles else ""
    if m and mig.endswith(_SHARED_SUFFIX):
        mig, sharing = mig[: -len(_SHARED_SUFFIX)], "time-slicing"
    strategy = labels.get(GFD_SHARING, "")
    if strategy in ("time-slicing", "mps"):
        sharing = strategy
    replicas = _int(labels.get(GFD_REPLICAS)) or 1
    if sharing == "none" and replicas > 1:
        sharing = "time-slicing"  # older device plugins set replicas without a strategy label
    major, minor = _first(labels, GFD_CC_MAJOR, FT_CC_MAJOR), _first(labels, GFD_CC_MINOR, FT_CC_MINOR)
    cc = f"{major}.{minor}" if major and minor else (_catalog_cc(product) if product else "")
    return NodeFingerprint(
        product=product,
        compute_capability=cc,
        driver_version=_first(labels, GFD_DRIVER, FT_DRIVER) or _joined(labels, GFD_DRIVER_OLD),
        cuda_runtime_version=_first(labels, GFD_RUNTIME, FT_RUNTIME) or _joined(labels, GFD_RUNTIME_OLD),
        mig_profile=mig,
        sharing=sharing,  # type: ignore[arg-type]
        replicas=max(1, replicas),
        arch=labels.get(ARCH, ""),
        l4t_version=labels.get(FT_L4T, ""),
        family=labels.get(GFD_FAMILY, ""),
        memory_mib=_int(labels.get(GFD_MEMORY)),
        source="gfd" if labels.get(GFD_PRODUCT) else "fleettune" if labels.get(FT_PRODUCT) else "",
    )


def relevant_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a fingerprint or eligibility depends on, so a node watch can ignore
    the rest (``nvidia.com/gfd.timestamp`` changes every minute)."""
    return {k: v for k, v in sorted(labels.items()) if k in RELEVANT_LABEL_KEYS or _MIG_COUNT.match(k)}


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
    fps: list[NodeFingerprint] = []
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
    groups: dict[tuple[str, ...], list[NodeFingerprint]] = {}
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


def is_stale(tuned_for: NodeFingerprint | None, current: NodeFingerprint | None) -> bool:
    """True when results tuned for ``tuned_for`` no longer describe ``current``.

    Unknown on either side (no result yet, no eligible node) is not stale: there is
    nothing to re-tune, or nothing to re-tune on.
    """
    if tuned_for is None or current is None or not tuned_for.known or not current.known:
        return False
    return tuned_for.stale_part() != current.stale_part()


def describe_change(old: NodeFingerprint | None, new: NodeFingerprint | None) -> str:
    """``"driver 550.54.15 → 560.35.03, CUDA 12.4 → 12.6"`` (the fields that make it stale)."""
    if old is None or new is None:
        return f"{describe(old)} → {describe(new)}"
    parts = [
        f"{_FIELD_NAMES[f]} {getattr(old, f) or 'none'} → {getattr(new, f) or 'none'}"
        for f in STALE_FIELDS
        if getattr(old, f) != getattr(new, f)
    ]
    return ", ".join(parts) or "no change"


def describe(fp: NodeFingerprint | None) -> str:
    """One line for messages: ``"NVIDIA-A100-PCIE-40GB (8.0), driver 550.127.05, CUDA 12.4"``."""
    if fp is None or not fp.known:
        return "unknown"
    text = fp.product + (f" MIG {fp.mig_profile}" if fp.mig_profile else "")
    text += f" ({fp.compute_capability})" if fp.compute_capability else ""
    text += f", driver {fp.driver_version or '?'}, CUDA {fp.cuda_runtime_version or '?'}"
    return text + (f", L4T {fp.l4t_version}" if fp.l4t_version else "")


_KEY_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]+")


def fingerprint_key(fp: NodeFingerprint) -> str:
    """A short stable key of the fields that matter, usable as a ConfigMap key or in a
    JSON document: ``NVIDIA-A100-PCIE-40GB_sm80_drv550.127.05_cuda12.4``."""
    parts = [
        fp.product or "unknown",
        "sm" + fp.compute_capability.replace(".", "") if fp.compute_capability else "",
        "drv" + fp.driver_version if fp.driver_version else "",
        "cuda" + fp.cuda_runtime_version if fp.cuda_runtime_version else "",
        "mig" + fp.mig_profile if fp.mig_profile else "",
        "l4t" + fp.l4t_version if fp.l4t_version else "",
    ]
    return "_".join(_KEY_UNSAFE.sub("-", p) for p in parts if p)


def fingerprint_hash(fp: NodeFingerprint) -> str:
    """10 hex characters of `fingerprint_key`: for label values and object names."""
    return hashlib.sha256(fingerprint_key(fp).encode()).hexdigest()[:10]


def from_device(fp: Any) -> NodeFingerprint:
    """A node fingerprint from the one a trial reports (``fleettune_job.protocol.Fingerprint``
    or its dict): the driver names the product with spaces, GFD with dashes."""
    data = fp if isinstance(fp, Mapping) else fp.model_dump()
    product = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(data.get("product") or "").strip()).strip("-_.")[:63]
    return NodeFingerprint(
        product=product,
        compute_capability=str(data.get("compute_capability") or ""),
        driver_version=str(data.get("driver_version") or ""),
        cuda_runtime_version=str(data.get("cuda_runtime_version") or ""),
        memory_mib=data.get("memory_mib"),
        source="device",
    )


def pinning_selector(fp: NodeFingerprint) -> dict[str, str]:
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
