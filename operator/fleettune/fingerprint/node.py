"""A node's GPU fingerprint from its labels (pure): the label keys and how they are read.

GPU Feature Discovery labels GPU nodes (``nvidia.com/...``); on Jetson nodes, where GFD
does not run, the project's own ``fleettune.dev/...`` labels say the same. This module
knows those keys, their spellings old and new (deprecated split version labels, MIG
suffixes of the product, per-profile counts under the "mixed" MIG strategy, shared-GPU
renames) and turns one node's labels into a `GpuFingerprint`. It also says which labels
matter at all (`relevant_labels`), so a node watch can ignore the ones that change
every minute.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from fleettune import GROUP
from fleettune.fingerprint.model import GpuFingerprint, Sharing

NV = "nvidia.com/"
FT = f"{GROUP}/"

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


_SHARING_STRATEGIES: dict[str, Sharing] = {"time-slicing": "time-slicing", "mps": "mps"}


def node_fingerprint(labels: Mapping[str, str]) -> GpuFingerprint:
    """The fingerprint of one node from its labels (GFD, else the project's Jetson labels)."""
    product = _first(labels, GFD_PRODUCT, FT_PRODUCT)
    mig = ""
    sharing: Sharing = "none"
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
    sharing = _SHARING_STRATEGIES.get(labels.get(GFD_SHARING, ""), sharing)
    replicas = _int(labels.get(GFD_REPLICAS)) or 1
    if sharing == "none" and replicas > 1:
        sharing = "time-slicing"  # older device plugins set replicas without a strategy label
    major, minor = _first(labels, GFD_CC_MAJOR, FT_CC_MAJOR), _first(labels, GFD_CC_MINOR, FT_CC_MINOR)
    cc = f"{major}.{minor}" if major and minor else (_catalog_cc(product) if product else "")
    return GpuFingerprint(
        product=product,
        compute_capability=cc,
        driver_version=_first(labels, GFD_DRIVER, FT_DRIVER) or _joined(labels, GFD_DRIVER_OLD),
        cuda_runtime_version=_first(labels, GFD_RUNTIME, FT_RUNTIME) or _joined(labels, GFD_RUNTIME_OLD),
        mig_profile=mig,
        sharing=sharing,
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


