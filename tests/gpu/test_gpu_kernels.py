"""Compile, verify and time every built-in kernel on a real GPU; check the failures too.

Failures that poison the CUDA context (illegal address, hung kernel) run as a Pod runs
them: a batch of one, its worker in a process of its own under the batch supervisor's
watchdog, so that the tests after them keep a healthy context.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from fleettune_job.batch import run_batch
from fleettune_job.protocol import Batch, KernelRef, Outcome, Trial, TrialResult
from fleettune_job.runner import run_trial

pytestmark = pytest.mark.gpu

JOB_IMAGE = Path(__file__).resolve().parents[2] / "job_image"


def trial(name: str, config: dict[str, Any], problem_size: list[int], **kw: Any) -> Trial:
    return Trial(run="gpu-test", target="local", index=0, kernel=KernelRef(builtin=name), config=config,
                 problem_size=problem_size, warmups=kw.pop("warmups", 1), repeats=kw.pop("repeats", 3), **kw)


VALID = [
    ("convolution", {}, [4096, 4096]),  # the recorded space's default, at its problem size
    ("convolution", {"block_size_x": 32, "block_size_y": 4, "tile_size_x": 1, "tile_size_y": 3,
                     "read_only": 1, "use_padding": 0, "use_shmem": 1}, [1024, 1024]),
    ("convolution", {"block_size_x": 48, "block_size_y": 8, "tile_size_x": 2, "tile_size_y": 2,
                     "use_padding": 1, "use_shmem": 1}, [1000, 600]),
    ("convolution", {"block_size_x": 128, "block_size_y": 2, "tile_size_x": 4, "tile_size_y": 1,
                     "read_only": 1, "use_padding": 0, "use_shmem": 0}, [1024, 1024]),
    ("gemm", {}, [2048, 2048, 2048]),
    ("gemm", {"block_size_x": 32, "block_size_y": 8, "tile_size_x": 4, "tile_size_y": 8, "tile_k": 8,
              "vector_width": 4, "use_padding": 0, "unroll_k": 1}, [512, 512, 512]),
    ("gemm", {"block_size_x": 8, "block_size_y": 8, "tile_size_x": 1, "tile_size_y": 2, "tile_k": 32,
              "vector_width": 1, "use_padding": 1, "unroll_k": 0}, [256, 128, 512]),
    ("scan", {}, [4096, 4096]),
    ("scan", {"block_size_x": 1024, "rows_per_block": 1, "items_per_thread": 16, "vector_width": 4,
              "use_shuffle": 1}, [100_000, 16]),
    ("scan", {"block_size_x": 96, "rows_per_block": 4, "items_per_thread": 3, "vector_width": 1,
              "use_shuffle": 0}, [4099, 33]),
]


@pytest.mark.parametrize(("name", "config", "problem_size"), VALID,
                         ids=[f"{v[0]}-{i}" for i, v in enumerate(VALID)])
def test_builtin_compiles_verifies_and_times(name: str, config: dict[str, Any], problem_size: list[int]) -> None:
    result = run_trial(trial(name, config, problem_size))
    assert result.outcome == Outcome.OK, result.error
    assert result.objective is not None and result.objective > 0
    assert len(result.times) == 3
    assert result.compile_s is not None
    fp = result.fingerprint
    assert fp.product and fp.compute_capability.count(".") == 1 and (fp.sm_count or 0) > 0
    assert fp.cuda_runtime_version and fp.driver_version
    assert len(result.encode()) <= 4096


def test_minimum_duration_adds_repeats() -> None:
    result = run_trial(trial("scan", {}, [1024, 64], repeats=2, min_duration_s=0.05))
    assert result.outcome == Outcome.OK, result.error
    assert len(result.times) > 2


def test_a_slow_configuration_is_pruned_on_the_gpu() -> None:
    full = run_trial(trial("scan", {}, [1024, 64], repeats=7))
    assert full.outcome == Outcome.OK and len(full.times) == 7, full.error
    # A cut-off below its own time: pruned after 3 launches; far above it: timed in full.
    pruned = run_trial(trial("scan", {}, [1024, 64], repeats=7, prune_above_ms=full.objective / 10))
    assert pruned.outcome == Outcome.OK and len(pruned.times) == 3, pruned.error
    kept = run_trial(trial("scan", {}, [1024, 64], repeats=7, prune_above_ms=full.objective * 1000))
    assert len(kept.times) == 7


MUST_FAIL = [
    # 2048 threads per block: the launch is refused.
    ("convolution", {"block_size_x": 256, "block_size_y": 8, "use_padding": 0, "use_shmem": 0}, [1024, 1024],
     Outcome.LAUNCH_ERROR),
    ("gemm", {"block_size_x": 64, "block_size_y": 32, "tile_size_x": 1, "tile_size_y": 1, "tile_k": 8},
     [1024, 1024, 1024], Outcome.LAUNCH_ERROR),
    ("scan", {"block_size_x": 1024, "rows_per_block": 2}, [4096, 64], Outcome.LAUNCH_ERROR),
    # More than 48 KiB of static shared memory: refused when building the module.
    ("convolution", {"block_size_x": 256, "block_size_y": 4, "tile_size_x": 4, "tile_size_y": 4,
                     "use_padding": 0, "use_shmem": 1}, [4096, 4096], Outcome.COMPILE_ERROR),
    ("gemm", {"block_size_x": 64, "block_size_y": 16, "tile_size_x": 8, "tile_size_y": 8, "tile_k": 32},
     [1024, 1024, 1024], Outcome.COMPILE_ERROR),
    # Rejected by the kernel's own rules before compiling.
    ("scan", {"items_per_thread": 3, "vector_width": 2}, [4096, 64], Outcome.COMPILE_ERROR),
]


@pytest.mark.parametrize(("name", "config", "problem_size", "outcome"), MUST_FAIL,
                         ids=[f"{v[0]}-{v[3]}-{i}" for i, v in enumerate(MUST_FAIL)])
def test_invalid_configurations_fail_with_the_right_outcome(name: str, config: dict[str, Any],
                                                            problem_size: list[int], outcome: Outcome) -> None:
    result = run_trial(trial(name, config, problem_size))
    assert result.outcome == outcome, result.error
    assert result.error
    assert result.fingerprint.product


def test_in_process_compile_cache() -> None:
    config = {"block_size_x": 64, "items_per_thread": 2, "vector_width": 2}
    first = run_trial(trial("scan", config, [2048, 32]))
    second = run_trial(trial("scan", config, [2048, 32]))
    assert first.outcome == second.outcome == Outcome.OK
    assert second.compile_s is not None and second.compile_s < 0.05


def _user_scan(tmp_path: Path, body: str) -> KernelRef:
    src = tmp_path / "user_scan.cu"
    src.write_text('extern "C" __global__ void user_scan(float *out, const float *in) {\n' + body + "\n}\n")
    return KernelRef(builtin="scan", source_path=str(src), function="user_scan",
                     grid=["problem_size[1]"], block=["1"])


SEQUENTIAL_SCAN = """
    const long long row = blockIdx.x;
    float s = 0.0f;
    for (int i = 0; i < row_length; i++) { s += in[row * row_length + i]; out[row * row_length + i] = s; }
"""


def test_user_source_is_compiled_verified_and_timed(tmp_path: Path) -> None:
    t = trial("scan", {}, [512, 64]).model_copy(update={"kernel": _user_scan(tmp_path, SEQUENTIAL_SCAN)})
    result = run_trial(t)
    assert result.outcome == Outcome.OK, result.error


def test_user_source_with_a_bug_is_a_correctness_error(tmp_path: Path) -> None:
    buggy = SEQUENTIAL_SCAN.replace("i < row_length", "i < row_length - 1")
    t = trial("scan", {}, [512, 64]).model_copy(update={"kernel": _user_scan(tmp_path, buggy)})
    result = run_trial(t)
    assert result.outcome == Outcome.CORRECTNESS_ERROR, result.error
    assert "never written" in result.error


def test_user_source_that_does_not_compile(tmp_path: Path) -> None:
    t = trial("scan", {}, [512, 64]).model_copy(update={"kernel": _user_scan(tmp_path, "this is not C++;")})
    result = run_trial(t)
    assert result.outcome == Outcome.COMPILE_ERROR and "error" in result.error


def in_a_pod(t: Trial, extra_env: dict[str, str] | None = None) -> TrialResult:
    """``t`` as a Pod measures it: a batch of one, in a worker process under the watchdog."""
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(JOB_IMAGE), os.environ.get("PYTHONPATH", "")) if p)}
    one = Batch.model_validate(t.model_dump(exclude={"index", "config"})
                               | {"entries": [{"index": t.index, "config": t.config}]})
    with tempfile.TemporaryDirectory(prefix="gpu-test-") as tmp:
        result = run_batch(one, Path(tmp) / "termination-log", extra_env=env | (extra_env or {}))
    assert result.done, result.error
    (answer,) = result.answers
    return answer.result(result.fingerprint)


def test_illegal_address_is_a_runtime_error(tmp_path: Path) -> None:
    body = "out[(long long)threadIdx.x * 4000000000LL + 4000000000LL] = 1.0f;"
    t = trial("scan", {}, [512, 64]).model_copy(update={"kernel": _user_scan(tmp_path, body)})
    result = in_a_pod(t)
    assert result.outcome == Outcome.RUNTIME_ERROR, result.error


def test_a_hung_kernel_times_out(tmp_path: Path) -> None:
    # clock64() is read anew each turn and its sign is unknown to the compiler, so the loop
    # stays; NVRTC 13 removed `volatile int spin = 1; while (spin) {}` (found on an H200).
    body = "while (clock64() >= 0) { }"
    t = trial("scan", {}, [512, 64], timeout_s=15).model_copy(update={"kernel": _user_scan(tmp_path, body)})
    result = in_a_pod(t)
    assert result.outcome == Outcome.TIMEOUT, result.error
    assert "phase run" in result.error



def test_the_first_configuration_is_not_charged_for_cupys_own_compiles(tmp_path: Path) -> None:
    """With an empty cupy kernel cache, as in every trial Pod, cupy compiles the kernels of
    the reference and the comparison before the first launch: 6 to 8 s on an H200, which
    used to land in the first configuration's GPU time (`run_s`) and keep a pool's first
    batches small (docs/decisions.md)."""
    result = in_a_pod(trial("convolution", {}, [1024, 1024]), {"CUPY_CACHE_DIR": str(tmp_path / "empty-cupy-cache")})
    assert result.outcome == Outcome.OK, result.error
    assert result.run_s is not None and result.run_s < 1.0, result.run_s


@pytest.mark.parametrize(("name", "problem_size"), [("convolution", [1024, 1024]), ("gemm", [512, 512, 512]),
                                                    ("scan", [4096, 64])])
def test_verification_compiles_none_of_cupys_array_kernels(tmp_path: Path, name: str,
                                                            problem_size: list[int]) -> None:
    """A trial Pod's cupy cache starts empty. Its verification runs on the job's own kernels
    (verify.cu), so cupy compiles two modules, the trial's kernel and verify.cu, not the
    dozen elementwise and reduction kernels of the array code (6 to 8 s on an H200)."""
    cache = tmp_path / "empty-cupy-cache"
    result = in_a_pod(trial(name, {}, problem_size), {"CUPY_CACHE_DIR": str(cache)})
    assert result.outcome == Outcome.OK, result.error
    compiled = sorted(p.name for p in cache.rglob("*") if p.is_file())
    assert len(compiled) <= 2, compiled
