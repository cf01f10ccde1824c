"""Compile-ahead: pool sizing, ptxas's resource report, the resource check, which faults
need a fresh CUDA context — and, with the real NVRTC, a cubin for sm_80 with its
register count, compile errors as the worker would report them, and the process pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cuda_fakes import CompileException

from fleettune_job import nvrtc
from fleettune_job.ahead import (
    Build,
    CompileAhead,
    cgroup_cpus,
    compile_build,
    compile_workers,
    make_executor,
    stop_executor,
)
from fleettune_job.classify import Phase, classify, poisons_context
from fleettune_job.prepare import Prepared, prepare
from fleettune_job.protocol import KernelRef, Outcome, Trial
from fleettune_job.resources import over_limits, ptxas_resources

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found (pip install "
                                 "nvidia-cuda-nvrtc-cu12 or set FLEETTUNE_NVRTC)")
LIMITS = {"maxThreadsPerBlock": 1024, "sharedMemPerBlock": 49152, "regsPerBlock": 65536}


def builtin(name: str, config: dict[str, Any] | None = None, problem_size: list[int] | None = None,
            index: int = 0) -> Trial:
    return Trial(run="r", target="t", index=index, kernel=KernelRef(builtin=name), config=config or {},
                 problem_size=problem_size or [])


def prepared(trial: Trial) -> Prepared:
    p = prepare(trial)
    assert isinstance(p, Prepared)
    return p


@pytest.mark.parametrize(("env", "cpus", "workers"), [
    ({}, 1, 1), ({}, 2, 1), ({}, 3, 2), ({}, 64, 4),
    ({"FLEETTUNE_COMPILE_WORKERS": "0"}, 8, 0), ({"FLEETTUNE_COMPILE_WORKERS": "6"}, 2, 6),
    ({"FLEETTUNE_COMPILE_WORKERS": "lots"}, 3, 2),
])
def test_the_pool_leaves_a_core_to_the_gpu_worker(env: dict[str, str], cpus: int, workers: int) -> None:
    assert compile_workers(env, cpus) == workers


def test_the_containers_cpu_limit_comes_from_its_cgroup(tmp_path: Path) -> None:
    assert cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpus(tmp_path) == 2.5
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(tmp_path) == 1.5


PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'helper_kernel' for 'sm_80'
ptxas info    : Function properties for helper_kernel
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compiling entry function 'gemm_kernel' for 'sm_80'
ptxas info    : Function properties for gemm_kernel
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 65 registers, used 1 barriers, 8512 bytes smem, 376 bytes cmem[0]
"""


def test_ptxas_reports_registers_and_shared_memory_per_kernel() -> None:
    assert ptxas_resources(PTXAS_LOG, "gemm_kernel") == {"num_regs": 65, "shared_size_bytes": 8512,
                                                         "local_size_bytes": 16}
    assert ptxas_resources(PTXAS_LOG, "helper_kernel") == {"num_regs": 8, "shared_size_bytes": 0,
                                                           "local_size_bytes": 0}
    assert ptxas_resources(PTXAS_LOG, "missing") == {}
    assert ptxas_resources("", "gemm_kernel") == {}


def test_only_certain_launch_failures_are_refused_before_the_gpu() -> None:
    scan = prepared(builtin("scan", {"block_size_x": 1024, "items_per_thread": 4}))
    assert scan.threads_per_block == 1024
    assert over_limits(scan, {"num_regs": 64, "shared_size_bytes": 0}, LIMITS) is None  # 65536: the GPU decides
    assert "65 registers/thread x 1024 threads = 66560 registers" in (over_limits(scan, {"num_regs": 65}, LIMITS) or "")
    assert "49153 B static shared memory" in (over_limits(scan, {"shared_size_bytes": 49153}, LIMITS) or "")
    assert "1024 threads per block, the device allows at most 512" in (
        over_limits(scan, {}, LIMITS | {"maxThreadsPerBlock": 512}) or "")
    assert over_limits(scan, {"num_regs": 255}, {}) is None  # limits unknown: nothing is refused


@pytest.mark.parametrize(("outcome", "error", "poisoned"), [
    (Outcome.RUNTIME_ERROR, "runtime error: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access", True),
    (Outcome.RUNTIME_ERROR, "runtime error: cudaErrorMisalignedAddress: misaligned address", True),
    (Outcome.RUNTIME_ERROR, "runtime error: CUDA_ERROR_ILLEGAL_INSTRUCTION: an illegal instruction", True),
    (Outcome.RUNTIME_ERROR, "runtime error: cudaErrorHardwareStackError: hardware stack error", True),
    (Outcome.RUNTIME_ERROR, "runtime error: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure", True),
    (Outcome.RUNTIME_ERROR, "runtime error: CUDA_ERROR_ASSERT: device-side assert triggered", True),
    (Outcome.RUNTIME_ERROR, "runtime error: something without a name", True),
    (Outcome.INFRA_ERROR, "reference configuration failed: runtime error: CUDA_ERROR_ILLEGAL_ADDRESS: x", True),
    (Outcome.LAUNCH_ERROR, "launch error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested", False),
    (Outcome.LAUNCH_ERROR, "launch error: CUDA_ERROR_INVALID_VALUE: invalid argument (grid 1x1x1, ...)", False),
    (Outcome.LAUNCH_ERROR, "launch error: geometry does not evaluate", False),
    (Outcome.COMPILE_ERROR, "compile error: line 1: CUDA_ERROR_ILLEGAL_ADDRESS is undefined", False),
    (Outcome.CORRECTNESS_ERROR, "wrong result: 3 of 4096 elements differ", False),
    (Outcome.INFRA_ERROR, "out of GPU memory during allocate: cudaErrorMemoryAllocation", False),
])
def test_which_faults_leave_the_cuda_context_unusable(outcome: Outcome, error: str, poisoned: bool) -> None:
    assert poisons_context(outcome, error) is poisoned


# With the real NVRTC.

@needs_nvrtc
def test_a_cubin_for_sm80_with_its_register_count(tmp_path: Path) -> None:
    p = prepared(builtin("gemm"))
    artefact = compile_build(Build.of(p), "8.0", str(tmp_path))
    assert artefact.path == str(tmp_path / f"{p.key}.cubin") and not artefact.error and not artefact.note
    assert Path(artefact.path).read_bytes()[:4] == b"\x7fELF"
    assert 16 <= artefact.resources["num_regs"] <= 255
    # gemm's A and B slices: (64 * 17 + 16 * 65) floats with the default tiles and padding.
    assert artefact.resources["shared_size_bytes"] == (64 * 17 + 16 * 65) * 4
    assert artefact.seconds > 0


@needs_nvrtc
def test_a_compile_error_reads_as_the_workers_would(tmp_path: Path) -> None:
    source = tmp_path / "k.cu"
    source.write_text('extern "C" __global__ void k(float *x) {\n#if BS > 256\n  x[0] = undefined_name;\n#endif\n}\n')
    trial = Trial(run="r", target="t", index=0, config={"BS": 512}, problem_size=[16],
                  kernel=KernelRef(source_path=str(source), function="k", grid=["1"], block=["BS"],
                                   arguments=[{"name": "x", "length": "16", "output": True}],
                                   verification={"reference_config": {"BS": 128}}))
    user = prepare(trial)
    build = Build.of(user.candidate)  # type: ignore[union-attr]
    artefact = compile_build(build, "8.0", str(tmp_path))
    assert not artefact.path and artefact.seconds > 0
    # What the worker answers for cupy's CompileException carrying NVRTC's log.
    log = nvrtc.compile_source(build.source, [*build.options, "-arch=sm_80"]).log
    assert artefact.error == classify(CompileException(log), Phase.COMPILE)[1]
    assert artefact.error.startswith("compile error: line 3: error: identifier \"undefined_name\" is undefined")

    # ptxas's own errors: with -Xptxas=-v NVRTC's log holds the report, not the error.
    shared = 'extern "C" __global__ void k(float *x) { __shared__ float s[BS * 64]; s[threadIdx.x] = 1; x[0] = s[7]; }'
    artefact = compile_build(Build(key="big", source=shared, options=("-DBS=512",), function="k"), "8.0",
                             str(tmp_path))
    assert artefact.error == ("compile error: ptxas error : Entry function 'k' uses too much shared data "
                              "(0x20000 bytes, 0xc000 max)")


@needs_nvrtc
def test_an_architecture_nvrtc_does_not_know_gives_no_verdict(tmp_path: Path) -> None:
    artefact = compile_build(Build.of(prepared(builtin("scan"))), "99.9", str(tmp_path))
    assert not artefact.path and not artefact.error and "status 5" in artefact.note


@needs_nvrtc
def test_the_process_pool_compiles_ahead(tmp_path: Path) -> None:
    trials = [builtin("scan", {"block_size_x": 64}, index=1), builtin("scan", {"block_size_x": 256}, index=2),
              builtin("scan", {"block_size_x": 64}, index=3)]
    executor = make_executor(2)
    try:
        ahead = CompileAhead(trials, compute_capability="8.0", limits=LIMITS, out_dir=tmp_path, executor=executor)
        first, second, again = (ahead.verdict(t, 60) for t in trials)
    finally:
        stop_executor(executor)
    assert first.result is None and second.result is None
    ((key, (path, seconds)),) = first.cubins.items()
    assert Path(path).is_file() and seconds > 0 and key == prepared(trials[0]).key
    assert again.cubins == first.cubins  # the same build, compiled once
    assert second.cubins.keys() != first.cubins.keys()
