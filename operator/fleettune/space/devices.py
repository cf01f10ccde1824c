"""Device limits of common NVIDIA GPUs, so each target pool gets the space valid for its GPU.

Per-architecture limits come from the CUDA C Programming Guide's "technical specifications per
compute capability" table; per-product numbers (SM count, L2, memory) from NVIDIA's product
specifications. `lookup_device` accepts what the fleet actually reports: a GPU Feature
Discovery ``nvidia.com/gpu.product`` label ("NVIDIA-A100-SXM4-40GB", "Tesla-T4"), a CUDA /
Kernel Tuner device name ("NVIDIA GeForce RTX 2080 Ti"), or a compute capability ("8.6").
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from fleettune.space.errors import SpaceError

KIB = 1024


@dataclass(frozen=True)
class DeviceLimits:
    """Limits a constraint may read as ``device.<attribute>`` (all plain numbers, bytes for memory)."""

    name: str
    compute_capability_major: int
    compute_capability_minor: int
    multiprocessor_count: int
    l2_cache_size: int
    global_memory: int
    max_threads_per_block: int = 1024
    max_block_dim_x: int = 1024
    max_block_dim_y: int = 1024
    max_block_dim_z: int = 64
    max_grid_dim_x: int = 2**31 - 1
    max_grid_dim_y: int = 65535
    max_grid_dim_z: int = 65535
    warp_size: int = 32
    max_threads_per_multiprocessor: int = 2048
    max_blocks_per_multiprocessor: int = 32
    max_warps_per_multiprocessor: int = 64
    shared_memory_per_block: int = 48 * KIB  # static limit, without the opt-in attribute
    shared_memory_per_block_optin: int = 48 * KIB
    shared_memory_per_multiprocessor: int = 64 * KIB
    registers_per_block: int = 64 * KIB
    registers_per_multiprocessor: int = 64 * KIB
    max_registers_per_thread: int = 255
    constant_memory: int = 64 * KIB

    @property
    def compute_capability(self) -> int:
        """Major*10 + minor, e.g. 86 for an RTX 3090, so constraints can compare it as a number."""
        return self.compute_capability_major * 10 + self.compute_capability_minor

    @property
    def cc(self) -> str:
        return f"{self.compute_capability_major}.{self.compute_capability_minor}"


DEVICE_ATTRIBUTES: tuple[str, ...] = (
    *(f.name for f in dataclasses.fields(DeviceLimits) if f.name != "name"),
    "compute_capability",
)

# Per compute capability: the fields that depend only on the architecture.
_ARCH: dict[str, dict[str, int]] = {
    "6.0": dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32, max_warps_per_multiprocessor=64,
                shared_memory_per_block_optin=48 * KIB, shared_memory_per_multiprocessor=64 * KIB),
    "6.1": dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32, max_warps_per_multiprocessor=64,
                shared_memory_per_block_optin=48 * KIB, shared_memory_per_multiprocessor=96 * KIB),
    "7.0": dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32, max_warps_per_multiprocessor=64,
                shared_memory_per_block_optin=96 * KIB, shared_memory_per_multiprocessor=96 * KIB),
    "7.2": dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32, max_warps_per_multiprocessor=64,
                shared_memory_per_block_optin=96 * KIB, shared_memory_per_multiprocessor=96 * KIB),
    "7.5": dict(max_threads_per_multiprocessor=1024, max_blocks_per_multiprocessor=16, max_warps_per_multiprocessor=32,
                shared_memory_per_block_optin=64 * KIB, shared_memory_per_multiprocessor=64 * KIB),
    "8.0": dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32, max_warps_per_multiprocessor=64,
                shared_memory_per_block_optin=163 * KIB, shared_memory_per_multiprocessor=164 * KIB),
    "8.6": dict(max_threads_per_multiprocessor=1536, max_blocks_per_multiprocessor=16, max_warps_per_multiprocessor=48,
                shared_memory_per_block_optin=99 * KIB, shared_memory_per_multiprocessor=100 * KIB),
    "8.7": dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=16, max_warps_per_multiprocessor=48,
                shared_memory_per_block_optin=163 * KIB, shared_memory_per_multiprocessor=164 * KIB),
    "8.9": dict(max_threads_per_multiprocessor=1536, max_blocks_per_multiprocessor=24, max_warps_per_multiprocessor=48,
                shared_memory_per_block_optin=99 * KIB, shared_memory_per_multiprocessor=100 * KIB),
    "9.0": dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32, max_warps_per_multiprocessor=64,
                shared_memory_per_block_optin=227 * KIB, shared_memory_per_multiprocessor=228 * KIB),
}
_ARCH["8.7"]["max_warps_per_multiprocessor"] = 64

MIB = 1024 * KIB
GIB = 1024 * MIB


def _device(name: str, cc: str, sms: int, l2_mib: float, mem_gib: float) -> DeviceLimits:
    major, minor = (int(p) for p in cc.split("."))
    return DeviceLimits(name=name, compute_capability_major=major, compute_capability_minor=minor,
                        multiprocessor_count=sms, l2_cache_size=int(l2_mib * MIB), global_memory=int(mem_gib * GIB),
                        **_ARCH[cc])


# (pattern over the normalised name, device). Normalising lower-cases, drops vendor words
# ("nvidia", "geforce", "tesla") and turns separators into spaces; more specific patterns first.
_CATALOG: list[tuple[str, DeviceLimits]] = [
    # data centre
    (r"h100 (sxm|hbm3)|h100 80gb hbm3|h100$|h100 sxm5", _device("NVIDIA H100 SXM5 80GB", "9.0", 132, 50, 80)),
    (r"h100 nvl", _device("NVIDIA H100 NVL", "9.0", 132, 50, 94)),
    (r"h100 pcie|h100 80gb pcie", _device("NVIDIA H100 PCIe", "9.0", 114, 50, 80)),
    (r"h200", _device("NVIDIA H200", "9.0", 132, 50, 141)),
    (r"gh200", _device("NVIDIA GH200", "9.0", 132, 50, 96)),
    (r"a100.*80gb", _device("NVIDIA A100 80GB", "8.0", 108, 40, 80)),
    (r"a100", _device("NVIDIA A100 40GB", "8.0", 108, 40, 40)),
    (r"a30\b", _device("NVIDIA A30", "8.0", 56, 24, 24)),
    (r"a40\b", _device("NVIDIA A40", "8.6", 84, 6, 48)),
    (r"a10g\b", _device("NVIDIA A10G", "8.6", 80, 6, 24)),
    (r"a10\b", _device("NVIDIA A10", "8.6", 72, 6, 24)),
    (r"a16\b", _device("NVIDIA A16", "8.6", 10, 2, 16)),
    (r"a2\b", _device("NVIDIA A2", "8.6", 10, 2, 16)),
    (r"l40s", _device("NVIDIA L40S", "8.9", 142, 96, 48)),
    (r"l40\b", _device("NVIDIA L40", "8.9", 142, 96, 48)),
    (r"l4\b", _device("NVIDIA L4", "8.9", 58, 48, 24)),
    (r"t4\b", _device("NVIDIA T4", "7.5", 40, 4, 16)),
    (r"v100.*32gb", _device("NVIDIA V100 32GB", "7.0", 80, 6, 32)),
    (r"v100", _device("NVIDIA V100 16GB", "7.0", 80, 6, 16)),
    (r"p100", _device("NVIDIA P100", "6.0", 56, 4, 16)),
    # professional (Ampere "RTX A" series, Ada "RTX ... Ada")
    (r"rtx a2000", _device("NVIDIA RTX A2000", "8.6", 26, 3, 6)),
    (r"rtx a4000", _device("NVIDIA RTX A4000", "8.6", 48, 4, 16)),
    (r"rtx a4500", _device("NVIDIA RTX A4500", "8.6", 56, 6, 20)),
    (r"rtx a5000", _device("NVIDIA RTX A5000", "8.6", 64, 6, 24)),
    (r"rtx a5500", _device("NVIDIA RTX A5500", "8.6", 80, 6, 24)),
    (r"rtx a6000", _device("NVIDIA RTX A6000", "8.6", 84, 6, 48)),
    (r"rtx 6000 ada|rtx 6000$", _device("NVIDIA RTX 6000 Ada Generation", "8.9", 142, 96, 48)),
    (r"rtx 4000 ada", _device("NVIDIA RTX 4000 Ada Generation", "8.9", 48, 48, 20)),
    (r"titan rtx", _device("NVIDIA TITAN RTX", "7.5", 72, 6, 24)),
    (r"titan v\b", _device("NVIDIA TITAN V", "7.0", 80, 4.5, 12)),
    # GeForce RTX 20 (Turing)
    (r"rtx 2060 super", _device("NVIDIA GeForce RTX 2060 SUPER", "7.5", 34, 4, 8)),
    (r"rtx 2060", _device("NVIDIA GeForce RTX 2060", "7.5", 30, 3, 6)),
    (r"rtx 2070 super", _device("NVIDIA GeForce RTX 2070 SUPER", "7.5", 40, 4, 8)),
    (r"rtx 2070", _device("NVIDIA GeForce RTX 2070", "7.5", 36, 4, 8)),
    (r"rtx 2080 super", _device("NVIDIA GeForce RTX 2080 SUPER", "7.5", 48, 4, 8)),
    (r"rtx 2080 ti", _device("NVIDIA GeForce RTX 2080 Ti", "7.5", 68, 5.5, 11)),
    (r"rtx 2080", _device("NVIDIA GeForce RTX 2080", "7.5", 46, 4, 8)),
    # GeForce RTX 30 (Ampere)
    (r"rtx 3050", _device("NVIDIA GeForce RTX 3050", "8.6", 20, 2, 8)),
    (r"rtx 3060 ti", _device("NVIDIA GeForce RTX 3060 Ti", "8.6", 38, 4, 8)),
    (r"rtx 3060", _device("NVIDIA GeForce RTX 3060", "8.6", 28, 3, 12)),
    (r"rtx 3070 ti", _device("NVIDIA GeForce RTX 3070 Ti", "8.6", 48, 4, 8)),
    (r"rtx 3070", _device("NVIDIA GeForce RTX 3070", "8.6", 46, 4, 8)),
    (r"rtx 3080 ti", _device("NVIDIA GeForce RTX 3080 Ti", "8.6", 80, 6, 12)),
    (r"rtx 3080", _device("NVIDIA GeForce RTX 3080", "8.6", 68, 5, 10)),
    (r"rtx 3090 ti", _device("NVIDIA GeForce RTX 3090 Ti", "8.6", 84, 6, 24)),
    (r"rtx 3090", _device("NVIDIA GeForce RTX 3090", "8.6", 82, 6, 24)),
    # GeForce RTX 40 (Ada)
    (r"rtx 4060 ti", _device("NVIDIA GeForce RTX 4060 Ti", "8.9", 34, 32, 8)),
    (r"rtx 4060", _device("NVIDIA GeForce RTX 4060", "8.9", 24, 24, 8)),
    (r"rtx 4070 ti super", _device("NVIDIA GeForce RTX 4070 Ti SUPER", "8.9", 66, 48, 16)),
    (r"rtx 4070 ti", _device("NVIDIA GeForce RTX 4070 Ti", "8.9", 60, 48, 12)),
    (r"rtx 4070 super", _device("NVIDIA GeForce RTX 4070 SUPER", "8.9", 56, 48, 12)),
    (r"rtx 4070", _device("NVIDIA GeForce RTX 4070", "8.9", 46, 36, 12)),
    (r"rtx 4080 super", _device("NVIDIA GeForce RTX 4080 SUPER", "8.9", 80, 64, 16)),
    (r"rtx 4080", _device("NVIDIA GeForce RTX 4080", "8.9", 76, 64, 16)),
    (r"rtx 4090", _device("NVIDIA GeForce RTX 4090", "8.9", 128, 72, 24)),
    # Jetson (integrated GPU, memory shared with the CPU)
    (r"orin nano.*4gb", _device("NVIDIA Jetson Orin Nano 4GB", "8.7", 4, 2, 4)),
    (r"orin nano", _device("NVIDIA Jetson Orin Nano 8GB", "8.7", 8, 2, 8)),
    (r"orin nx", _device("NVIDIA Jetson Orin NX 16GB", "8.7", 8, 4, 16)),
    (r"agx orin|orin$|orin nvgpu|jetson orin$", _device("NVIDIA Jetson AGX Orin", "8.7", 16, 4, 32)),
    (r"xavier nx", _device("NVIDIA Jetson Xavier NX", "7.2", 6, 0.5, 8)),
    (r"xavier", _device("NVIDIA Jetson AGX Xavier", "7.2", 8, 0.5, 32)),
]

KNOWN_DEVICES: tuple[DeviceLimits, ...] = tuple(d for _, d in _CATALOG)
_COMPILED = [(re.compile(p), d) for p, d in _CATALOG]


def normalise_product(product: str) -> str:
    """'NVIDIA-GeForce-RTX-2080-Ti' / 'NVIDIA GeForce RTX 2080 Ti' → 'rtx 2080 ti'."""
    text = product.lower().replace("_", " ").replace("-", " ")
    text = re.sub(r"\((.*?)\)", r" \1 ", text)
    words = [w for w in text.split() if w not in ("nvidia", "geforce", "tesla", "jetson", "generation",
                                                  "laptop", "gpu", "shared")]
    text = " ".join(words)
    # GFD splits sizes as "40GB"; names sometimes say "40 GB".
    return re.sub(r"(\d+) gb\b", r"\1gb", text)


def _generic(cc: str) -> DeviceLimits:
    if cc not in _ARCH:
        raise SpaceError("device", f"unknown compute capability {cc!r}; known: {', '.join(sorted(_ARCH))}")
    major, minor = (int(p) for p in cc.split("."))
    # Only the architecture limits are known; SM count, L2 and memory are conservative stand-ins.
    return DeviceLimits(name=f"generic compute capability {cc}", compute_capability_major=major,
                        compute_capability_minor=minor, multiprocessor_count=1, l2_cache_size=0, global_memory=0,
                        **_ARCH[cc])


def lookup_device(product: str | None = None, compute_capability: str | tuple[int, int] | None = None) -> DeviceLimits:
    """Limits of a GPU by product name (GFD label, CUDA name) or, failing that, by compute capability.

    Raises `SpaceError` (field "device") when neither identifies a GPU in the catalog.
    """
    if product:
        key = normalise_product(str(product))
        for pattern, device in _COMPILED:
            if pattern.search(key):
                return device
    if compute_capability is not None:
        cc = compute_capability if isinstance(compute_capability, str) else "{}.{}".format(*compute_capability)
        return _generic(cc.strip())
    if not product:
        raise SpaceError("device", "give a GPU product name or a compute capability")
    raise SpaceError("device", f"unknown GPU product {product!r} (normalised {normalise_product(str(product))!r}); "
                               "give its compute capability to use the architecture's limits")
