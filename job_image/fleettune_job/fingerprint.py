"""What the numbers were measured on: GPU product, compute capability, driver, CUDA runtime.

The operator keys results by this fingerprint and re-tunes a pool when it changes, so
the driver version must be the one Kubernetes labels show (GPU Feature Discovery's
``nvidia.com/cuda.driver-version.full``, e.g. ``550.54.15``). It comes from NVML when the
library is mounted into the container (NVIDIA_DRIVER_CAPABILITIES includes ``utility``),
then from ``/proc/driver/nvidia/version``; Jetson has neither, and falls back to the
CUDA driver API version.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any

from fleettune_job.protocol import Fingerprint

PROC_VERSION = Path("/proc/driver/nvidia/version")
_PROC_VERSION_RE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


def cuda_version_string(version: int) -> str:
    """CUDA's integer versions (12040) as ``12.4``."""
    if version <= 0:
        return ""
    return f"{version // 1000}.{(version % 1000) // 10}"


def parse_proc_version(text: str) -> str | None:
    """Driver version from ``/proc/driver/nvidia/version``."""
    match = _PROC_VERSION_RE.search(text)
    return match.group(1) if match else None


def nvml_driver_version() -> str | None:
    """The driver version through NVML, via ctypes so the image needs no extra package."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
        if init() != 0:
            return None
        try:
            buf = ctypes.create_string_buffer(96)
            if lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf))) != 0:
                return None
            return buf.value.decode(errors="replace") or None
        finally:
            lib.nvmlShutdown()
    except (AttributeError, OSError):
        return None


def driver_version(cuda_driver_api_version: int) -> str:
    version = nvml_driver_version()
    if version:
        return version
    try:
        version = parse_proc_version(PROC_VERSION.read_text())
    except OSError:
        version = None
    if version:
        return version
    api = cuda_version_string(cuda_driver_api_version)
    return f"cuda-{api}" if api else ""


def from_properties(props: dict[str, Any], runtime_version: int, driver: str) -> Fingerprint:
    """Build the fingerprint from cupy's ``getDeviceProperties`` dictionary."""
    name = props.get("name", b"")
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    memory = props.get("totalGlobalMem")
    return Fingerprint(
        product=str(name).strip(),
        compute_capability=f"{props.get('major', 0)}.{props.get('minor', 0)}",
        sm_count=int(props["multiProcessorCount"]) if "multiProcessorCount" in props else None,
        memory_mib=int(memory) // 2**20 if memory else None,
        driver_version=driver,
        cuda_runtime_version=cuda_version_string(runtime_version),
    )


def device_fingerprint(cupy: Any, device_id: int = 0) -> Fingerprint:
    runtime = cupy.cuda.runtime
    props = runtime.getDeviceProperties(device_id)
    return from_properties(props, runtime.runtimeGetVersion(), driver_version(runtime.driverGetVersion()))


def device_limits(cupy: Any, device_id: int = 0) -> dict[str, int]:
    """The limits that decide launch failures, for log lines and error texts."""
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    keys = ("maxThreadsPerBlock", "sharedMemPerBlock", "sharedMemPerBlockOptin", "regsPerBlock")
    return {k: int(props[k]) for k in keys if k in props}
