"""Turn whatever went wrong into one outcome of the protocol and a short, useful text.

The outcome decides what the operator learns: outcomes in the "invalid configuration"
band are feasibility observations (the optimiser avoids similar configurations), while
``infra_error`` means "this node failed, retry elsewhere". Getting this wrong either
poisons the surrogate with node faults or retries configurations that can never work,
so classification looks at the CUDA error *name* first and at the phase only as a
fallback. It works on exception class names and messages, never on cupy imports, so it
is testable without a GPU.
"""

from __future__ import annotations

import re
from enum import StrEnum

from fleettune_job.protocol import Outcome

MAX_ERROR_CHARS = 600


class Phase(StrEnum):
    SETUP = "setup"  # reading the trial, resolving the configuration
    DEVICE = "device"  # finding the GPU, fingerprinting it
    COMPILE = "compile"  # NVRTC, module load, constant-memory upload
    ALLOCATE = "allocate"  # input and output buffers
    LAUNCH = "launch"  # the kernel launch call itself
    RUN = "run"  # waiting for the kernel to finish
    VERIFY = "verify"  # reference computation (built-ins) and comparison
    REFERENCE = "reference"  # a user kernel's reference configuration: compile and run
    TIME = "time"  # warm-ups and timed repeats


class JobError(Exception):
    """Base of the errors the job raises itself; each carries its outcome."""

    outcome: Outcome = Outcome.INFRA_ERROR


class NoGpu(JobError):
    outcome = Outcome.INFRA_ERROR


class TrialSpecError(JobError):
    """The trial itself is unusable (bad problem size, unknown kernel, missing source)."""

    outcome = Outcome.INFRA_ERROR


class InvalidConfiguration(JobError):
    """The configuration breaks a rule of the kernel: it would not compile or not be correct."""

    outcome = Outcome.COMPILE_ERROR


class GeometryError(JobError):
    """The launch geometry expressions give no valid grid/block for this configuration."""

    outcome = Outcome.LAUNCH_ERROR


class WrongResult(JobError):
    outcome = Outcome.CORRECTNESS_ERROR


class ReferenceFailed(JobError):
    """The reference configuration of a user kernel failed: whatever the candidate did,
    there is nothing to check it against."""

    outcome = Outcome.INFRA_ERROR


# CUDA error names (driver or runtime spelling, normalised to UPPER_SNAKE without the
# prefix) that say something definite whatever the phase.
_INFRA = {
    "NO_DEVICE", "INVALID_DEVICE", "NOT_INITIALIZED", "DEINITIALIZED", "INSUFFICIENT_DRIVER",
    "SYSTEM_DRIVER_MISMATCH", "COMPAT_NOT_SUPPORTED_ON_DEVICE", "DEVICES_UNAVAILABLE",
    "DEVICE_UNAVAILABLE", "DEVICE_NOT_LICENSED", "ECC_UNCORRECTABLE", "OPERATING_SYSTEM",
    "SYSTEM_NOT_READY", "UNSUPPORTED_PTX_VERSION", "JIT_COMPILER_NOT_FOUND", "STUB_LIBRARY",
    "NVLINK_UNCORRECTABLE", "CONTAINED", "UNKNOWN", "DEVICE_UNINITIALIZED", "INITIALIZATION_ERROR",
}
_COMPILE = {
    "INVALID_PTX", "INVALID_IMAGE", "INVALID_KERNEL_IMAGE", "NO_BINARY_FOR_GPU",
    "NO_KERNEL_IMAGE_FOR_DEVICE", "INVALID_SOURCE", "SHARED_OBJECT_SYMBOL_NOT_FOUND",
    "SHARED_OBJECT_INIT_FAILED", "NOT_FOUND", "SYMBOL_NOT_FOUND", "INVALID_DEVICE_FUNCTION",
    "INVALID_SYMBOL", "JIT_COMPILATION_DISABLED",
}
_LAUNCH = {
    "LAUNCH_OUT_OF_RESOURCES", "INVALID_CONFIGURATION", "COOPERATIVE_LAUNCH_TOO_LARGE",
    "LAUNCH_INCOMPATIBLE_TEXTURING", "INVALID_CLUSTER_SIZE",
}
_RUNTIME = {
    "ILLEGAL_ADDRESS", "MISALIGNED_ADDRESS", "LAUNCH_FAILED", "LAUNCH_FAILURE", "ILLEGAL_INSTRUCTION",
    "HARDWARE_STACK_ERROR", "ASSERT", "INVALID_ADDRESS_SPACE", "INVALID_PC", "EXCEPTION",
    "LAUNCH_PENDING_COUNT_EXCEEDED", "TOO_MANY_PEERS",
}
_TIMEOUT = {"LAUNCH_TIMEOUT"}
_OUT_OF_MEMORY = {"OUT_OF_MEMORY", "MEMORY_ALLOCATION"}

_DRIVER_NAME = re.compile(r"\bCUDA_ERROR_([A-Z0-9_]+)")
_RUNTIME_NAME = re.compile(r"\bcudaError([A-Z][A-Za-z0-9]*)")
_CAMEL_SPLIT = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def cuda_error_name(text: str) -> str | None:
    """``CUDA_ERROR_ILLEGAL_ADDRESS`` / ``cudaErrorIllegalAddress`` -> ``ILLEGAL_ADDRESS``."""
    match = _DRIVER_NAME.search(text)
    if match:
        return match.group(1)
    match = _RUNTIME_NAME.search(text)
    if match:
        return _CAMEL_SPLIT.sub("_", match.group(1)).upper()
    return None


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def short(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_COMPILER_LINE = re.compile(r"(error|ptxas|#error|static assertion)", re.IGNORECASE)
_PATH_PREFIX = re.compile(r"^\S*?([A-Za-z0-9_.-]+\.cu)\((\d+)\):\s*")
_ANY_PATH = re.compile(r"(?:/[^/\s\"']+)+/([^/\s\"']+)")
_ERROR_COUNT = re.compile(r"^\d+ errors? detected")


def compiler_summary(log: str, max_lines: int = 3) -> str:
    """The first few error lines of an NVRTC/ptxas log, without temporary paths."""
    picked = []
    for raw in log.splitlines():
        line = raw.strip()
        if not line or not _COMPILER_LINE.search(line) or _ERROR_COUNT.search(line):
            continue
        line = _PATH_PREFIX.sub(lambda m: f"line {m.group(2)}: ", line)
        line = _ANY_PATH.sub(lambda m: m.group(1), line)
        picked.append(line)
        if len(picked) == max_lines:
            break
    if not picked:
        picked = [line.strip() for line in log.splitlines() if line.strip()][:max_lines]
    return "; ".join(picked)


def classify(exc: BaseException, phase: Phase) -> tuple[Outcome, str]:
    """Outcome and error text for ``exc`` raised during ``phase``."""
    if isinstance(exc, JobError):
        return exc.outcome, short(str(exc))
    names = _class_names(exc)
    message = str(exc)

    if "CompileException" in names:
        log = exc.get_message() if hasattr(exc, "get_message") else message
        return Outcome.COMPILE_ERROR, short(f"compile error: {compiler_summary(log)}")

    if isinstance(exc, ImportError):
        return Outcome.INFRA_ERROR, short(f"no GPU runtime: {message}")

    cuda_name = cuda_error_name(message)
    is_cuda = cuda_name is not None or names & {"CUDADriverError", "CUDARuntimeError", "OutOfMemoryError"}
    if is_cuda:
        return _classify_cuda(cuda_name, names, message, phase)

    if isinstance(exc, MemoryError):
        return Outcome.INFRA_ERROR, short(f"host out of memory during {phase}: {message}")
    # Anything else is a fault of this program or of the node, never of the configuration.
    return Outcome.INFRA_ERROR, short(f"internal error during {phase}: {type(exc).__name__}: {message}")


def _classify_cuda(name: str | None, names: set[str], message: str, phase: Phase) -> tuple[Outcome, str]:
    if "OutOfMemoryError" in names or name in _OUT_OF_MEMORY:
        # Buffers of the problem itself not fitting is the node's limit, not the
        # configuration's; memory a launch asks for (local memory, stacks) is.
        if phase in (Phase.LAUNCH, Phase.RUN, Phase.COMPILE):
            return Outcome.LAUNCH_ERROR, short(f"launch error: {message}")
        return Outcome.INFRA_ERROR, short(f"out of GPU memory during {phase}: {message}")
    if name in _INFRA:
        return Outcome.INFRA_ERROR, short(f"GPU/driver failure during {phase}: {message}")
    if name in _COMPILE:
        return Outcome.COMPILE_ERROR, short(f"compile error (module load): {message}")
    if name in _LAUNCH:
        return Outcome.LAUNCH_ERROR, short(f"launch error: {message}")
    if name in _RUNTIME:
        return Outcome.RUNTIME_ERROR, short(f"runtime error: {message}")
    if name in _TIMEOUT:
        return Outcome.TIMEOUT, short(f"timeout: {message}")
    if name == "INVALID_VALUE" and phase == Phase.LAUNCH:
        # cuLaunchKernel's answer to a block beyond the device's limits (e.g. > 1024 threads).
        return Outcome.LAUNCH_ERROR, short(f"launch error: {message}")
    by_phase = {
        Phase.COMPILE: (Outcome.COMPILE_ERROR, "compile error"),
        Phase.LAUNCH: (Outcome.LAUNCH_ERROR, "launch error"),
        Phase.RUN: (Outcome.RUNTIME_ERROR, "runtime error"),
        Phase.VERIFY: (Outcome.RUNTIME_ERROR, "runtime error"),
        Phase.TIME: (Outcome.RUNTIME_ERROR, "runtime error"),
    }
    outcome, label = by_phase.get(phase, (Outcome.INFRA_ERROR, f"GPU failure during {phase}"))
    return outcome, short(f"{label}: {message}")


# Errors after which the CUDA context is unusable: every later call of the process fails
# with the same error, so the next configuration needs a fresh process. A refused launch
# (too many resources, bad geometry) leaves the context intact.
_STICKY = {
    "ILLEGAL_ADDRESS", "MISALIGNED_ADDRESS", "ILLEGAL_INSTRUCTION", "HARDWARE_STACK_ERROR", "LAUNCH_FAILED",
    "LAUNCH_FAILURE", "ASSERT", "INVALID_ADDRESS_SPACE", "INVALID_PC", "EXCEPTION", "LAUNCH_TIMEOUT",
    "ECC_UNCORRECTABLE", "NVLINK_UNCORRECTABLE", "CONTAINED", "UNKNOWN",
}
_CONTEXT_SAFE = {Outcome.OK, Outcome.COMPILE_ERROR, Outcome.CORRECTNESS_ERROR}


def poisons_context(outcome: Outcome, error: str) -> bool:
    """Whether a process that answered ``outcome`` with ``error`` may have lost its CUDA context."""
    if outcome in _CONTEXT_SAFE:
        return False
    name = cuda_error_name(error)
    if name is not None:
        return name in _STICKY
    # A fault without a CUDA error name to go by: a fresh process costs a second, a
    # poisoned one every later configuration of the batch.
    return outcome == Outcome.RUNTIME_ERROR
