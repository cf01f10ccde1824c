"""Failure classification, with stand-ins for cupy's exception classes."""

from __future__ import annotations

import pytest

from fleettune_job.classify import (
    GeometryError,
    InvalidConfiguration,
    NoGpu,
    Phase,
    TrialSpecError,
    WrongResult,
    classify,
    compiler_summary,
    cuda_error_name,
)
from fleettune_job.protocol import Outcome


# Same class names and message formats as cupy's (cupy.cuda.compiler.CompileException,
# cupy_backends.cuda.api.driver.CUDADriverError / runtime.CUDARuntimeError).
class CompileException(Exception):
    def __init__(self, msg: str) -> None:
        super().__init__()
        self._msg = msg

    def __str__(self) -> str:
        return self._msg

    def get_message(self) -> str:
        return self._msg


class CUDADriverError(RuntimeError):
    pass


class CUDARuntimeError(RuntimeError):
    pass


class OutOfMemoryError(MemoryError):
    pass


NVRTC_LOG = """/tmp/tmpabc123/5f2e.cu(88): error: identifier "tile_kk" is undefined
/tmp/tmpabc123/5f2e.cu(90): warning #177-D: variable "x" was declared but never referenced

1 error detected in the compilation of "/tmp/tmpabc123/5f2e.cu".
"""

PTXAS_LOG = "ptxas error   : Entry function 'gemm_kernel' uses too much shared data (0x10200 bytes, 0xc000 max)"


@pytest.mark.parametrize(
    ("exc", "phase", "outcome", "fragment"),
    [
        (CompileException(NVRTC_LOG), Phase.COMPILE, Outcome.COMPILE_ERROR, 'line 88: error: identifier "tile_kk"'),
        (CompileException(PTXAS_LOG), Phase.COMPILE, Outcome.COMPILE_ERROR, "too much shared data"),
        (CUDADriverError("CUDA_ERROR_INVALID_PTX: a PTX JIT compilation failed"), Phase.COMPILE,
         Outcome.COMPILE_ERROR, "INVALID_PTX"),
        (CUDADriverError("CUDA_ERROR_NOT_FOUND: named symbol not found"), Phase.COMPILE,
         Outcome.COMPILE_ERROR, "named symbol"),
        (CUDADriverError("CUDA_ERROR_INVALID_VALUE: invalid argument"), Phase.LAUNCH,
         Outcome.LAUNCH_ERROR, "launch error"),
        (CUDADriverError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch"),
         Phase.LAUNCH, Outcome.LAUNCH_ERROR, "too many resources"),
        (CUDARuntimeError("cudaErrorInvalidConfiguration: invalid configuration argument"), Phase.LAUNCH,
         Outcome.LAUNCH_ERROR, "invalid configuration"),
        (CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered"), Phase.RUN,
         Outcome.RUNTIME_ERROR, "illegal memory access"),
        (CUDADriverError("CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address"), Phase.RUN,
         Outcome.RUNTIME_ERROR, "misaligned"),
        (CUDARuntimeError("cudaErrorLaunchFailure: unspecified launch failure"), Phase.TIME,
         Outcome.RUNTIME_ERROR, "unspecified"),
        (CUDARuntimeError("cudaErrorLaunchTimeout: the launch timed out and was terminated"), Phase.RUN,
         Outcome.TIMEOUT, "timed out"),
        (CUDARuntimeError("cudaErrorECCUncorrectable: uncorrectable ECC error encountered"), Phase.RUN,
         Outcome.INFRA_ERROR, "ECC"),
        (CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient"), Phase.DEVICE,
         Outcome.INFRA_ERROR, "insufficient"),
        (CUDADriverError("CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was compiled with an "
                         "unsupported toolchain."), Phase.COMPILE, Outcome.INFRA_ERROR, "unsupported toolchain"),
        (OutOfMemoryError("Out of memory allocating 68,719,476,736 bytes"), Phase.ALLOCATE,
         Outcome.INFRA_ERROR, "out of GPU memory"),
        (CUDADriverError("CUDA_ERROR_OUT_OF_MEMORY: out of memory"), Phase.LAUNCH, Outcome.LAUNCH_ERROR, "memory"),
        (CUDADriverError("CUDA_ERROR_SOMETHING_NEW: surprise"), Phase.LAUNCH, Outcome.LAUNCH_ERROR, "surprise"),
        (CUDADriverError("CUDA_ERROR_SOMETHING_NEW: surprise"), Phase.ALLOCATE, Outcome.INFRA_ERROR, "surprise"),
        (ImportError("libcuda.so.1: cannot open shared object file"), Phase.DEVICE, Outcome.INFRA_ERROR,
         "no GPU runtime"),
        (KeyError("oops"), Phase.VERIFY, Outcome.INFRA_ERROR, "internal error during verify: KeyError"),
        (NoGpu("no GPU: none visible"), Phase.DEVICE, Outcome.INFRA_ERROR, "no GPU"),
        (TrialSpecError("bad problem size"), Phase.SETUP, Outcome.INFRA_ERROR, "bad problem size"),
        (InvalidConfiguration("violates x"), Phase.SETUP, Outcome.COMPILE_ERROR, "violates x"),
        (GeometryError("grid"), Phase.SETUP, Outcome.LAUNCH_ERROR, "grid"),
        (WrongResult("3 of 9 elements wrong"), Phase.VERIFY, Outcome.CORRECTNESS_ERROR, "3 of 9"),
    ],
)
def test_classification(exc: BaseException, phase: Phase, outcome: Outcome, fragment: str) -> None:
    got, text = classify(exc, phase)
    assert got == outcome, text
    assert fragment in text
    assert len(text) <= 600


def test_invalid_configuration_outcomes_are_the_configurations_not_the_nodes() -> None:
    for outcome in (Outcome.COMPILE_ERROR, Outcome.LAUNCH_ERROR, Outcome.RUNTIME_ERROR,
                    Outcome.CORRECTNESS_ERROR, Outcome.TIMEOUT):
        assert outcome.is_invalid_configuration
    assert not Outcome.INFRA_ERROR.is_invalid_configuration and not Outcome.OK.is_invalid_configuration


@pytest.mark.parametrize(
    ("message", "name"),
    [
        ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access", "ILLEGAL_ADDRESS"),
        ("cudaErrorIllegalAddress: an illegal memory access", "ILLEGAL_ADDRESS"),
        ("cudaErrorLaunchOutOfResources: too many resources", "LAUNCH_OUT_OF_RESOURCES"),
        ("cudaErrorECCUncorrectable: x", "ECC_UNCORRECTABLE"),
        ("cudaErrorInvalidPtx: x", "INVALID_PTX"),
        ("nothing here", None),
    ],
)
def test_cuda_error_names_are_normalised(message: str, name: str | None) -> None:
    assert cuda_error_name(message) == name


def test_compiler_summary_keeps_the_first_errors_without_temporary_paths() -> None:
    summary = compiler_summary(NVRTC_LOG)
    assert "/tmp/" not in summary
    assert summary.startswith('line 88: error: identifier "tile_kk" is undefined')
    assert compiler_summary("just text\nmore") == "just text; more"
    long_log = "\n".join(f"k.cu({i}): error: e{i}" for i in range(10))
    assert compiler_summary(long_log).count("error") == 3


def test_very_long_errors_are_shortened() -> None:
    _, text = classify(CUDADriverError("CUDA_ERROR_ILLEGAL_ADDRESS: " + "x" * 5000), Phase.RUN)
    assert len(text) == 600 and text.endswith("…")
