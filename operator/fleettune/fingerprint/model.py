"""What a GPU is, for tuning: the one fingerprint model, its rules and its other shapes.

A fingerprint says what a result was measured on: GPU product, compute capability,
driver and CUDA versions, MIG profile and sharing mode (and, on Jetson, the L4T
release). `GpuFingerprint` is the one model of it: the run's status, the published ConfigMap
and the controller all pass it around, and this module holds its rules — which fields make
results stale (`STALE_FIELDS`, `is_stale`), how a change is told (`describe_change`), its
key. The other shapes are its serialisations, converted here and nowhere else:

* `fleettune.api.TunedFor`: the status's ``tunedFor`` and the published ``tuned.json``
  entries' ``fingerprint`` (`GpuFingerprint.to_status`, `GpuFingerprint.from_status`);
* `fleettune_job.protocol.Fingerprint`: what a trial reports of the device it ran on
  (the job image does not import the operator, so it has its own model): `from_device`
  compares it with a pool's; `device_status` is its form in the status's ``fingerprint``.

How a fingerprint is read from a node's labels is `fleettune.fingerprint.node`; which nodes
count and what a pool's fingerprint is, `fleettune.fingerprint.pool`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from fleettune.api import Fingerprint as DeviceStatus
from fleettune.api import TunedFor
from fleettune_job.protocol import Fingerprint as DeviceReport

Sharing = Literal["none", "time-slicing", "mps"]
Source = Literal["gfd", "fleettune", "device", ""]

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


class GpuFingerprint(BaseModel):
    """What a GPU is, as its node's labels (or a trial's report) say. Empty strings mean
    "not labelled"."""

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
    source: Source = ""  # whose labels (or the trial's report)

    @property
    def known(self) -> bool:
        return bool(self.product)

    @property
    def shared(self) -> bool:
        return self.sharing != "none" or self.replicas > 1

    def stale_part(self) -> tuple[str, ...]:
        return tuple(getattr(self, f) for f in STALE_FIELDS)

    def to_status(self) -> TunedFor:
        """The status's (and the published entry's) form: unset fields left out."""
        return TunedFor(**{name: self._status_value(name) for name in type(self).model_fields})

    def _status_value(self, name: str) -> Any:
        value = getattr(self, name)
        unset = value in ("", None) or (name == "sharing" and value == "none") or (name == "replicas" and value == 1)
        return None if unset else value

    @classmethod
    def from_status(cls, status: TunedFor | Mapping[str, Any]) -> GpuFingerprint:
        """From the status's model, or its camelCase JSON (the published ConfigMap's, where
        keys this version does not know are ignored)."""
        if isinstance(status, TunedFor):
            return cls(**status.model_dump(exclude_none=True))
        snake = {_snake(k): v for k, v in status.items()}
        return cls(**{k: v for k, v in snake.items() if k in cls.model_fields})


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()



def is_stale(tuned_for: GpuFingerprint | None, current: GpuFingerprint | None) -> bool:
    """True when results tuned for ``tuned_for`` no longer describe ``current``.

    Unknown on either side (no result yet, no eligible node) is not stale: there is
    nothing to re-tune, or nothing to re-tune on.
    """
    if tuned_for is None or current is None or not tuned_for.known or not current.known:
        return False
    return tuned_for.stale_part() != current.stale_part()


def describe_change(old: GpuFingerprint | None, new: GpuFingerprint | None) -> str:
    """``"driver 550.54.15 → 560.35.03, CUDA 12.4 → 12.6"`` (the fields that make it stale)."""
    if old is None or new is None:
        return f"{describe(old)} → {describe(new)}"
    parts = [
        f"{_FIELD_NAMES[f]} {getattr(old, f) or 'none'} → {getattr(new, f) or 'none'}"
        for f in STALE_FIELDS
        if getattr(old, f) != getattr(new, f)
    ]
    return ", ".join(parts) or "no change"


def describe(fp: GpuFingerprint | None) -> str:
    """One line for messages: ``"NVIDIA-A100-PCIE-40GB (8.0), driver 550.127.05, CUDA 12.4"``."""
    if fp is None or not fp.known:
        return "unknown"
    text = fp.product + (f" MIG {fp.mig_profile}" if fp.mig_profile else "")
    text += f" ({fp.compute_capability})" if fp.compute_capability else ""
    text += f", driver {fp.driver_version or '?'}, CUDA {fp.cuda_runtime_version or '?'}"
    return text + (f", L4T {fp.l4t_version}" if fp.l4t_version else "")


_KEY_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]+")


def fingerprint_key(fp: GpuFingerprint) -> str:
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


def from_device(report: DeviceReport | Mapping[str, Any]) -> GpuFingerprint:
    """The fingerprint of the device a trial reports (or of its dict): the driver names the
    product with spaces, GFD with dashes."""
    data = report if isinstance(report, Mapping) else report.model_dump()
    product = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(data.get("product") or "").strip()).strip("-_.")[:63]
    return GpuFingerprint(
        product=product,
        compute_capability=str(data.get("compute_capability") or ""),
        driver_version=str(data.get("driver_version") or ""),
        cuda_runtime_version=str(data.get("cuda_runtime_version") or ""),
        memory_mib=data.get("memory_mib"),
        source="device",
    )


def device_status(report: DeviceReport) -> DeviceStatus:
    """The status's ``fingerprint`` of a pool: the device its trials reported, as reported
    (the driver's product name; whether the timings were simulated, the outputs unchecked)."""
    return DeviceStatus(
        product=report.product,
        compute_capability=report.compute_capability,
        driver_version=report.driver_version,
        cuda_runtime_version=report.cuda_runtime_version,
        simulated=report.simulated,
        synthetic=report.synthetic,
        unverified=report.unverified,
    )


