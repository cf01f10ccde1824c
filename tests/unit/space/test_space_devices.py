"""Device catalog lookups by GPU Feature Discovery label, CUDA name or compute capability."""

from __future__ import annotations

import pytest

from fleettune.space import KNOWN_DEVICES, SpaceError, lookup_device


@pytest.mark.parametrize(("product", "name", "cc", "sms"), [
    ("NVIDIA-A100-SXM4-40GB", "NVIDIA A100 40GB", 80, 108),
    ("NVIDIA-A100-SXM4-80GB", "NVIDIA A100 80GB", 80, 108),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB", 80, 108),
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 SXM5 80GB", 90, 132),
    ("NVIDIA-H100-PCIe", "NVIDIA H100 PCIe", 90, 114),
    ("NVIDIA-L4", "NVIDIA L4", 89, 58),
    ("Tesla-T4", "NVIDIA T4", 75, 40),
    ("Tesla-V100-SXM2-16GB", "NVIDIA V100 16GB", 70, 80),
    ("NVIDIA-GeForce-RTX-2080-Ti", "NVIDIA GeForce RTX 2080 Ti", 75, 68),
    ("NVIDIA GeForce RTX 2080", "NVIDIA GeForce RTX 2080", 75, 46),
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090", 86, 82),
    ("NVIDIA-GeForce-RTX-4090", "NVIDIA GeForce RTX 4090", 89, 128),
    ("NVIDIA TITAN RTX", "NVIDIA TITAN RTX", 75, 72),
    ("NVIDIA RTX A4000", "NVIDIA RTX A4000", 86, 48),
    ("NVIDIA-RTX-A6000", "NVIDIA RTX A6000", 86, 84),
    ("NVIDIA-Jetson-AGX-Orin", "NVIDIA Jetson AGX Orin", 87, 16),
    ("Orin", "NVIDIA Jetson AGX Orin", 87, 16),
    ("NVIDIA Jetson Orin Nano", "NVIDIA Jetson Orin Nano 8GB", 87, 8),
    ("Jetson-AGX-Xavier", "NVIDIA Jetson AGX Xavier", 72, 8),
])
def test_lookup_by_product(product, name, cc, sms):
    dev = lookup_device(product=product)
    assert (dev.name, dev.compute_capability, dev.multiprocessor_count) == (name, cc, sms)


def test_architecture_limits():
    assert lookup_device(product="Tesla-T4").shared_memory_per_block_optin == 64 * 1024
    assert lookup_device(product="NVIDIA-A100-SXM4-40GB").shared_memory_per_block_optin == 163 * 1024
    assert lookup_device(product="NVIDIA-H100-80GB-HBM3").shared_memory_per_block_optin == 227 * 1024
    assert lookup_device(product="NVIDIA GeForce RTX 3090").max_threads_per_multiprocessor == 1536
    assert all(d.max_threads_per_block == 1024 and d.shared_memory_per_block == 48 * 1024 for d in KNOWN_DEVICES)


def test_fallback_to_compute_capability_and_errors():
    dev = lookup_device(product="NVIDIA-Unknown-9000", compute_capability="8.6")
    assert dev.compute_capability == 86 and dev.shared_memory_per_block_optin == 99 * 1024
    assert lookup_device(compute_capability=(9, 0)).shared_memory_per_multiprocessor == 228 * 1024
    with pytest.raises(SpaceError, match="unknown GPU product 'Voodoo-3'") as info:
        lookup_device(product="Voodoo-3")
    assert info.value.field == "device"
    with pytest.raises(SpaceError, match="unknown compute capability"):
        lookup_device(compute_capability="4.2")
