"""What a GPU is, for tuning: fingerprints from node labels, pools and staleness (pure).

A fingerprint says what a result was measured on: GPU product, compute capability,
driver and CUDA versions, MIG profile and sharing mode (and, on Jetson, the L4T
release). It comes from GPU Feature Discovery labels (``nvidia.com/...``) or, on Jetson
nodes where GFD does not run, from the project's own ``fleettune.dev/...`` labels.

* `fleettune.fingerprint.model`: `GpuFingerprint`, the one model of it, with its rules
  (staleness, description, key) and its conversions to the status and from a trial's report;
* `fleettune.fingerprint.node`: the label keys, and one node's fingerprint from its labels;
* `fleettune.fingerprint.pool`: which nodes are eligible, a pool's fingerprint, and the
  node selectors that keep trials on eligible nodes with one driver stack.

Import the names from here: ``from fleettune.fingerprint import GpuFingerprint, is_stale``.
"""

from fleettune.fingerprint.model import (
    STALE_FIELDS,
    GpuFingerprint,
    Sharing,
    Source,
    describe,
    describe_change,
    device_status,
    fingerprint_key,
    from_device,
    is_stale,
)
from fleettune.fingerprint.node import (
    ARCH,
    FT,
    FT_CC_MAJOR,
    FT_CC_MINOR,
    FT_DRIVER,
    FT_L4T,
    FT_PRODUCT,
    FT_RUNTIME,
    GFD_CC_MAJOR,
    GFD_CC_MINOR,
    GFD_DRIVER,
    GFD_DRIVER_OLD,
    GFD_FAMILY,
    GFD_MEMORY,
    GFD_MIG_STRATEGY,
    GFD_PRODUCT,
    GFD_REPLICAS,
    GFD_RUNTIME,
    GFD_RUNTIME_OLD,
    GFD_SHARING,
    NV,
    RELEVANT_LABEL_KEYS,
    UPGRADE_DONE,
    UPGRADE_STATE,
    node_fingerprint,
    relevant_labels,
)
from fleettune.fingerprint.pool import (
    UPGRADE_IN_PROGRESS,
    PoolFingerprint,
    eligibility_affinity,
    node_eligible,
    pinning_selector,
    pool_fingerprint,
)

__all__ = [
    "ARCH",
    "FT",
    "FT_CC_MAJOR",
    "FT_CC_MINOR",
    "FT_DRIVER",
    "FT_L4T",
    "FT_PRODUCT",
    "FT_RUNTIME",
    "GFD_CC_MAJOR",
    "GFD_CC_MINOR",
    "GFD_DRIVER",
    "GFD_DRIVER_OLD",
    "GFD_FAMILY",
    "GFD_MEMORY",
    "GFD_MIG_STRATEGY",
    "GFD_PRODUCT",
    "GFD_REPLICAS",
    "GFD_RUNTIME",
    "GFD_RUNTIME_OLD",
    "GFD_SHARING",
    "NV",
    "RELEVANT_LABEL_KEYS",
    "STALE_FIELDS",
    "UPGRADE_DONE",
    "UPGRADE_IN_PROGRESS",
    "UPGRADE_STATE",
    "GpuFingerprint",
    "PoolFingerprint",
    "Sharing",
    "Source",
    "describe",
    "describe_change",
    "device_status",
    "eligibility_affinity",
    "fingerprint_key",
    "from_device",
    "is_stale",
    "node_eligible",
    "node_fingerprint",
    "pinning_selector",
    "pool_fingerprint",
    "relevant_labels",
]
