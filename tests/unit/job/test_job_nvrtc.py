"""The built-in kernels through the real CUDA compiler, without a GPU.

NVRTC (and the ptxas inside it) needs no device, only libnvrtc: from a CUDA toolkit, or
the ``nvidia-cuda-nvrtc-cu12`` wheel, or the path in ``FLEETTUNE_NVRTC``. This checks
that every built-in compiles for the GPUs of the fleet (Jetson Orin sm_87 included), and
that "too much shared memory" configurations are refused at compile time, which is what
the job classifies as compile_error. Skipped where libnvrtc is not found.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fleettune_job.classify import compiler_summary
from fleettune_job.prepare import prepare
from fleettune_job.protocol import KernelRef, Trial


@cache
def nvrtc() -> ctypes.CDLL | None:
    candidates = [os.environ.get("FLEETTUNE_NVRTC", "")]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(str(Path(root) / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"))
    candidates += [ctypes.util.find_library("nvrtc") or "", "/usr/local/cuda/lib64/libnvrtc.so"]
    for path in candidates:
        if path:
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


pytestmark = pytest.mark.skipif(nvrtc() is None, reason="libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12 "
                                                      "or set FLEETTUNE_NVRTC)")


def nvrtc_compile(source: str, options: list[str]) -> tuple[bool, str]:
    lib = nvrtc()
    assert lib is not None
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None) == 0
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        ok = lib.nvrtcCompileProgram(prog, len(options), opts) == 0
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        return ok, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def build(name: str, config: dict[str, Any], problem_size: list[int], arch: str = "sm_80") -> tuple[bool, str]:
    p = prepare(Trial(run="r", target="t", index=0, kernel=KernelRef(builtin=name), config=config,
                      problem_size=problem_size))
    return nvrtc_compile(p.source, [*p.options, f"-arch={arch}"])


@pytest.mark.parametrize("arch", ["sm_75", "sm_87", "sm_90"])
@pytest.mark.parametrize("name", ["convolution", "gemm", "scan"])
def test_default_configuration_compiles_for_the_fleets_gpus(name: str, arch: str) -> None:
    ok, log = build(name, {}, [], arch)
    assert ok, log
    assert "warning" not in log.replace("declared but never referenced", ""), log


VARIANTS = [
    ("convolution", {"block_size_x": 48, "block_size_y": 8, "tile_size_x": 3, "tile_size_y": 2,
                     "read_only": 1, "use_padding": 1, "use_shmem": 1}),
    ("convolution", {"block_size_x": 32, "block_size_y": 16, "tile_size_x": 4, "tile_size_y": 4,
                     "read_only": 0, "use_padding": 0, "use_shmem": 0, "use_cmem": 0}),
    ("gemm", {"tile_k": 32, "vector_width": 2, "use_padding": 0, "unroll_k": 0}),
    ("gemm", {"block_size_x": 32, "block_size_y": 8, "tile_size_x": 8, "tile_size_y": 8, "vector_width": 1}),
    ("scan", {"block_size_x": 1024, "items_per_thread": 16, "vector_width": 4, "use_shuffle": 1}),
    ("scan", {"block_size_x": 96, "rows_per_block": 8, "items_per_thread": 3, "vector_width": 1, "use_shuffle": 0}),
]


@pytest.mark.parametrize(("name", "config"), VARIANTS, ids=[f"{v[0]}-{i}" for i, v in enumerate(VARIANTS)])
def test_variants_compile(name: str, config: dict[str, Any]) -> None:
    ok, log = build(name, config, [])
    assert ok, log


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("convolution", {"block_size_x": 256, "block_size_y": 4, "tile_size_x": 4, "tile_size_y": 4,
                         "use_padding": 0, "use_shmem": 1}),
        ("gemm", {"block_size_x": 64, "block_size_y": 16, "tile_size_x": 8, "tile_size_y": 8, "tile_k": 32}),
    ],
)
def test_too_much_shared_memory_is_refused_at_compile_time(name: str, config: dict[str, Any]) -> None:
    ok, log = build(name, config, [1024] * (3 if name == "gemm" else 2))
    assert not ok
    assert "too much shared data" in compiler_summary(log)


def test_static_assertions_guard_the_kernel_rules() -> None:
    p = prepare(Trial(run="r", target="t", index=0, kernel=KernelRef(builtin="gemm"), config={},
                      problem_size=[1024, 1024, 1024]))
    options = [o if not o.startswith("-Dmatrix_m=") else "-Dmatrix_m=1000" for o in p.options]
    ok, log = nvrtc_compile(p.source, [*options, "-arch=sm_80"])
    assert not ok
    assert "M must be a multiple of block_size_y * tile_size_y" in compiler_summary(log)
