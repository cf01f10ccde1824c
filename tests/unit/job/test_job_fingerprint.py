from __future__ import annotations

from types import SimpleNamespace

from fleettune_job import fingerprint
from fleettune_job.fingerprint import cuda_version_string, device_fingerprint, from_properties, parse_proc_version

PROPS = {
    "name": b"NVIDIA A100-PCIE-40GB",
    "major": 8,
    "minor": 0,
    "multiProcessorCount": 108,
    "totalGlobalMem": 42_505_273_344,
    "maxThreadsPerBlock": 1024,
    "sharedMemPerBlock": 49152,
}


def test_cuda_versions_read_like_nvidia_smi() -> None:
    assert cuda_version_string(12040) == "12.4"
    assert cuda_version_string(11080) == "11.8"
    assert cuda_version_string(0) == ""


def test_driver_version_from_proc() -> None:
    closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC ..."
    open_ = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)"
    assert parse_proc_version(closed) == "535.104.05"
    assert parse_proc_version(open_) == "550.54.15"
    assert parse_proc_version("garbage") is None


def test_fingerprint_from_device_properties() -> None:
    fp = from_properties(PROPS, 12040, "550.54.15")
    assert fp.product == "NVIDIA A100-PCIE-40GB"
    assert fp.compute_capability == "8.0" and fp.sm_count == 108 and fp.memory_mib == 40536
    assert fp.driver_version == "550.54.15" and fp.cuda_runtime_version == "12.4"
    assert not fp.simulated


def test_fingerprint_falls_back_to_the_driver_api_version(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(fingerprint, "nvml_driver_version", lambda: None)
    monkeypatch.setattr(fingerprint, "PROC_VERSION", fingerprint.Path("/nonexistent/version"))
    runtime = SimpleNamespace(getDeviceProperties=lambda i: PROPS, runtimeGetVersion=lambda: 12060,
                              driverGetVersion=lambda: 12060)
    fp = device_fingerprint(SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    assert fp.driver_version == "cuda-12.6" and fp.cuda_runtime_version == "12.6"


def test_nvml_absent_is_not_an_error() -> None:
    # No NVIDIA driver on CI machines: must answer None, not raise.
    assert fingerprint.nvml_driver_version() in (None,) or isinstance(fingerprint.nvml_driver_version(), str)
