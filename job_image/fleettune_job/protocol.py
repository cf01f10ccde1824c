"""The one protocol between a trial Job and the operator.

The operator hands a trial to its Job in the ``FLEETTUNE_TRIAL`` environment variable
(a JSON :class:`Trial`). The job container writes one JSON :class:`TrialResult` of at
most 4 KiB to ``/dev/termination-log`` and exits with the code of its outcome. The
operator reads that message back from the Pod's container status: no sidecar, no
network path from jobs to the operator. The fleet simulator speaks the same protocol,
so swapping simulated nodes for real GPUs changes nothing in the operator.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PROTOCOL_VERSION: Final = 1
MAX_MESSAGE_BYTES = 4096  # kubelet truncates termination messages at 4 KiB
TRIAL_ENV = "FLEETTUNE_TRIAL"
TERMINATION_LOG = "/dev/termination-log"
CONTAINER_NAME = "trial"


class Outcome(StrEnum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"
    RUNTIME_ERROR = "runtime_error"
    CORRECTNESS_ERROR = "correctness_error"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"

    @property
    def is_invalid_configuration(self) -> bool:
        """A property of the configuration (a feasibility observation), not of the node."""
        return self not in (Outcome.OK, Outcome.INFRA_ERROR)


# Exit codes. The 10-19 band means "this configuration is invalid": the Job's
# podFailurePolicy fails the Job at once (no retry). 20 means the infrastructure failed:
# the Job retries within its backoffLimit and no observation is recorded.
EXIT_CODES: dict[Outcome, int] = {
    Outcome.OK: 0,
    Outcome.COMPILE_ERROR: 10,
    Outcome.LAUNCH_ERROR: 11,
    Outcome.RUNTIME_ERROR: 12,
    Outcome.CORRECTNESS_ERROR: 13,
    Outcome.TIMEOUT: 14,
    Outcome.INFRA_ERROR: 20,
}
INVALID_CONFIG_EXIT_CODES = sorted(c for o, c in EXIT_CODES.items() if o.is_invalid_configuration)
OUTCOME_BY_EXIT_CODE = {c: o for o, c in EXIT_CODES.items()}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ArgumentDtype = Literal[
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
]
ArgumentInit = Literal["random", "zeros", "constant", "data"]


class Argument(_Strict):
    """One argument of a user kernel, in the kernel's parameter order.

    An ``array`` is a device buffer of ``length`` elements (an expression of
    ``problem_size`` only, so every configuration solves the same problem), filled by
    ``init``: ``random`` (seeded: ``seed``, default derived from the argument's position),
    ``zeros``, ``constant`` (``constant``) or ``data`` (whitespace- or comma-separated
    numbers in the file ``data_path``, mounted from the source ConfigMap). A ``scalar`` is
    passed by value: ``value`` is an expression of the parameters and ``problem_size``.
    ``output`` arrays are compared with the reference after a launch.
    """

    name: str
    kind: Literal["array", "scalar"] = "array"
    dtype: ArgumentDtype = "float32"
    length: str | None = None
    value: str | None = None
    init: ArgumentInit = "random"
    constant: float | None = None
    seed: int | None = None
    data_path: str | None = None
    output: bool = False


class Verification(_Strict):
    """How a user kernel's outputs are checked: against the outputs of the same source
    compiled and launched with ``reference_config`` (the kernel's default configuration),
    or of ``reference_function`` in the same source (launched with the reference
    configuration's geometry). An element passes when ``|got - expected| <= atol + rtol *
    |expected|``; NaN where the reference has a number fails."""

    reference_config: dict[str, Any]
    reference_function: str | None = None
    atol: float = Field(default=1e-6, ge=0)
    rtol: float = Field(default=1e-5, ge=0)


class KernelRef(_Strict):
    """Which kernel a trial runs: a built-in of the job image, or user CUDA source.

    For user source, ``source_path`` is where the Job mounts the ConfigMap key, the launch
    geometry is given as expressions of the parameters and ``problem_size``, and
    ``arguments`` and ``verification`` say how to feed and check the kernel (a user kernel
    with ``builtin`` set instead implements that built-in's interface).
    """

    builtin: str | None = None
    source_path: str | None = None
    function: str | None = None
    grid: list[str] | None = None
    block: list[str] | None = None
    arguments: list[Argument] | None = None
    verification: Verification | None = None
    # SHA-256 of the source the operator checked: the ConfigMap is mounted live, and a trial
    # of an edited source would measure another kernel than its round's.
    source_sha256: str | None = None


class Trial(_Strict):
    version: int = PROTOCOL_VERSION
    run: str
    target: str
    index: int = Field(ge=0)
    kernel: KernelRef
    config: dict[str, Any]
    problem_size: list[int]
    warmups: int = Field(default=3, ge=0)
    repeats: int = Field(default=7, ge=1)
    min_duration_s: float = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)

    def to_env(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_env(cls, text: str) -> Trial:
        return cls.model_validate_json(text)


class Fingerprint(_Strict):
    """What the numbers were measured on."""

    product: str = ""
    compute_capability: str = ""
    sm_count: int | None = None
    memory_mib: int | None = None
    driver_version: str = ""
    cuda_runtime_version: str = ""
    simulated: bool = False
    synthetic: bool = False  # simulated from a model, not from a recording


class TrialResult(_Strict):
    version: Literal[1] = PROTOCOL_VERSION
    outcome: Outcome
    objective: float | None = None  # milliseconds, median of the repeats
    times: list[float] = Field(default_factory=list)
    fingerprint: Fingerprint = Fingerprint()
    error: str = ""
    compile_s: float | None = None
    run_s: float | None = None

    @field_validator("objective")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError("objective must be a positive finite number")
        return v

    def model_post_init(self, __context: Any) -> None:
        if self.outcome == Outcome.OK and self.objective is None:
            raise ValueError("an ok result needs an objective")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def encode(self) -> str:
        """Compact JSON that always fits in a termination message (drops detail, never the verdict)."""
        doc = self
        text = doc.model_dump_json(exclude_none=True)
        if len(text.encode()) > MAX_MESSAGE_BYTES:
            doc = doc.model_copy(update={"times": doc.times[:16]})
            text = doc.model_dump_json(exclude_none=True)
        while len(text.encode()) > MAX_MESSAGE_BYTES and doc.error:
            doc = doc.model_copy(update={"error": doc.error[: len(doc.error) // 2] + "…"})
            text = doc.model_dump_json(exclude_none=True)
        return text


class ProtocolError(ValueError):
    """A termination message that is not a valid result: an infrastructure failure."""


def decode(message: str | None) -> TrialResult:
    if not message or not message.strip():
        raise ProtocolError("empty termination message")
    if len(message.encode()) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"termination message of {len(message.encode())} bytes exceeds 4 KiB")
    try:
        raw = json.loads(message)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"termination message is not JSON: {exc.msg} at {exc.pos}") from None
    if not isinstance(raw, dict):
        raise ProtocolError("termination message is not a JSON object")
    if raw.get("version") != PROTOCOL_VERSION:
        raise ProtocolError(f"unknown protocol version {raw.get('version')!r}")
    try:
        return TrialResult.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "result"
        raise ProtocolError(f"invalid result: {where}: {first['msg']}") from None


def infra_failure(error: str) -> TrialResult:
    return TrialResult(outcome=Outcome.INFRA_ERROR, error=error[:1000])
