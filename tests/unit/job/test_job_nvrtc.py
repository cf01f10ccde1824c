"""The built-in kernels, and a user kernel as prepare() builds it, through the real CUDA
compiler, without a GPU.

NVRTC (and the ptxas inside it) needs no device, only libnvrtc (``fleettune_job.nvrtc``
finds it: a CUDA toolkit, the ``nvidia-cuda-nvrtc-cu12`` wheel, or the path in
``FLEETTUNE_NVRTC``). This checks that every built-in compiles for the GPUs of the fleet
(Jetson Orin sm_87 included), that a user kernel and its reference compile with the
defines the job passes, and that "too much shared memory" configurations are refused at
compile time, which is what the job classifies as compile_error. Skipped where libnvrtc
is not found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleettune_job import nvrtc
from fleettune_job.classify import compiler_summary
from fleettune_job.prepare import Prepared, PreparedUser, prepare
from fleettune_job.protocol import Argument, KernelRef, Trial, Verification

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found (pip install "
                                "nvidia-cuda-nvrtc-cu12 or set FLEETTUNE_NVRTC)")


def nvrtc_compile(source: str, options: list[str]) -> tuple[bool, str]:
    compiled = nvrtc.compile_source(source, options)
    return compiled.ok, compiled.log


def build(name: str, config: dict[str, Any], problem_size: list[int], arch: str = "sm_80") -> tuple[bool, str]:
    p = prepare(Trial(run="r", target="t", index=0, kernel=KernelRef(builtin=name), config=config,
                      problem_size=problem_size))
    assert isinstance(p, Prepared)
    return nvrtc_compile(p.code, [*p.options, f"-arch={arch}"])


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
    assert isinstance(p, Prepared)
    code = p.code.replace("#define matrix_m 1024\n", "#define matrix_m 1000\n")
    ok, log = nvrtc_compile(code, [*p.options, "-arch=sm_80"])
    assert not ok
    assert "M must be a multiple of block_size_y * tile_size_y" in compiler_summary(log)


USER_SOURCE = r"""
extern "C" __global__ void saxpy(float *y, const float *x, float a, int n) {
    __shared__ float stage[BLOCK * ITEMS];
    const int base = blockIdx.x * BLOCK * ITEMS;
    for (int k = 0; k < ITEMS; k++) {
        const int i = base + k * BLOCK + threadIdx.x;
        stage[k * BLOCK + threadIdx.x] = i < n ? x[i] : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < ITEMS; k++) {
        const int i = base + k * BLOCK + threadIdx.x;
        if (i < n) y[i] += a * stage[k * BLOCK + threadIdx.x];
    }
}

extern "C" __global__ void saxpy_ref(float *y, const float *x, float a, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
"""


def user_kernel(tmp_path: Path, config: dict[str, Any]) -> PreparedUser:
    src = tmp_path / "saxpy.cu"
    src.write_text(USER_SOURCE)
    kernel = KernelRef(
        source_path=str(src), function="saxpy", grid=["cdiv(problem_size[0], BLOCK * ITEMS)"], block=["BLOCK"],
        arguments=[Argument(name="y", length="problem_size[0]", output=True),
                   Argument(name="x", length="problem_size[0]"),
                   Argument(name="a", kind="scalar", value="2"),
                   Argument(name="n", kind="scalar", dtype="int32", value="problem_size[0]")],
        verification=Verification(reference_config={"BLOCK": 128, "ITEMS": 1}, reference_function="saxpy_ref"),
    )
    p = prepare(Trial(run="r", target="t", index=0, kernel=kernel, config=config, problem_size=[100_000]))
    assert isinstance(p, PreparedUser)
    return p


@pytest.mark.parametrize("cc", ["8.0", "8.7"])
def test_a_user_kernel_and_its_reference_compile_with_the_jobs_options(tmp_path: Path, cc: str) -> None:
    p = user_kernel(tmp_path, {"BLOCK": 256, "ITEMS": 4})
    assert p.reference is not None
    for build in (p.candidate, p.reference):
        assert nvrtc.check_kernel(build.code, build.options, build.function, cc) is None
    # The defines are what sizes the kernel: without them it does not compile at all.
    ok, log = nvrtc_compile(USER_SOURCE, [nvrtc.arch_option(cc)])
    assert not ok and "BLOCK" in compiler_summary(log)


def test_a_user_configuration_beyond_the_shared_memory_limit_is_refused(tmp_path: Path) -> None:
    build = user_kernel(tmp_path, {"BLOCK": 1024, "ITEMS": 16}).candidate  # 64 KiB of static shared memory
    problem = nvrtc.check_kernel(build.code, build.options, build.function, "8.7")
    assert problem is not None and "too much shared data" in problem
    assert nvrtc.check_kernel(build.code, build.options, "saxpy_typo", "8.0") is not None
