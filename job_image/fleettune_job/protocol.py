"""The one protocol between a trial Job and the operator.

Every trial Job measures a *batch*: configurations of one target in one Pod (one CUDA
context, one interpreter, one Pod start-up), a batch of one where a Pod measures a single
configuration. The operator hands the batch to its Job in the ``FLEETTUNE_TRIAL``
environment variable (a JSON :class:`Batch`). The job container writes one JSON
:class:`BatchResult` of at most 4 KiB to ``/dev/termination-log`` — one compact answer per
finished configuration — and rewrites it after every configuration, because the kubelet
reads it however the container ends (exit, OOM kill, eviction, deadline): what a Pod
finished before it died is kept. The operator reads that message back from the Pod's
container status: no sidecar, no network path from jobs to the operator. The fleet
simulator speaks the same protocol, so swapping simulated nodes for real GPUs changes
nothing in the operator.

A batch container exits 0 once every configuration is answered (invalid ones included:
their verdicts are in the message, so an invalid configuration costs no retry) and 20 when
it stopped early; the operator re-suggests what was not answered and never records it as
invalid. Each configuration is measured as a :class:`Trial` (``Batch.trial``) with its own
:class:`TrialResult`, which the batch's worker process hands to its supervisor.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PROTOCOL_VERSION: Final = 1
MAX_MESSAGE_BYTES = 4096  # kubelet truncates termination messages at 4 KiB
TRIAL_ENV = "FLEETTUNE_TRIAL"
# Timed launches a configuration gets before ``prune_above_ms`` applies: enough to tell a
# configuration twice as slow as the best from timing noise.
PRUNE_RUNS: Final = 3
TERMINATION_LOG = "/dev/termination-log"
CONTAINER_NAME = "trial"
# A batch prints each answer on its stdout as this prefix + JSON (`Answer.line`), for the
# operator to learn it while the Pod runs; the termination message stays the record.
ANSWER_PREFIX = "fleettune-answer "


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


# The batch container's exit codes: every configuration answered, or stopped early (an
# infrastructure failure: what was not answered is measured again, never recorded as invalid).
EXIT_ANSWERED: Final = 0
EXIT_STOPPED_EARLY: Final = 20


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
    # The source's language: CUDA C (compiled with NVRTC) or a Triton module (its compiler).
    language: Literal["cuda", "triton"] = "cuda"
    arguments: list[Argument] | None = None
    verification: Verification | None = None
    # SHA-256 of the source the operator checked: the ConfigMap is mounted live, and a trial
    # of an edited source would measure another kernel than its round's.
    source_sha256: str | None = None


class Trial(_Strict):
    """One configuration as the job measures it: a :class:`Batch`'s common fields with one
    entry's index and configuration (``Batch.trial``)."""

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
    # Pruning: timing stops after PRUNE_RUNS timed launches whose median is above this (ms),
    # and the output is not verified. The operator sets it to a multiple (at least 1) of the
    # pool's best time: a configuration that slow cannot become the best, and PRUNE_RUNS
    # launches place it for the optimiser (fleettune_job.timing.pruned_after).
    prune_above_ms: float | None = Field(default=None, gt=0)


class Entry(_Strict):
    """One configuration of a batch, with its trial index."""

    index: int = Field(ge=0)
    config: dict[str, Any]


MAX_BATCH = 48  # so that a whole batch's verdicts fit a 4 KiB termination message (a unit test checks the worst case)


class Batch(_Strict):
    """Configurations of one target for one Pod, measured in order; ``timeout_s`` is each
    configuration's own limit, as for a :class:`Trial`."""

    version: int = PROTOCOL_VERSION
    run: str
    target: str
    kernel: KernelRef
    entries: list[Entry] = Field(min_length=1, max_length=MAX_BATCH)
    problem_size: list[int]
    warmups: int = Field(default=3, ge=0)
    repeats: int = Field(default=7, ge=1)
    min_duration_s: float = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)
    prune_above_ms: float | None = Field(default=None, gt=0)  # as a Trial's, for every entry

    @field_validator("entries")
    @classmethod
    def _distinct(cls, v: list[Entry]) -> list[Entry]:
        if len({e.index for e in v}) != len(v):
            raise ValueError("entries must have distinct indexes")
        return v

    def trial(self, entry: Entry) -> Trial:
        common = self.model_dump(exclude={"entries"})
        return Trial.model_validate(common | {"index": entry.index, "config": entry.config})

    def trials(self) -> list[Trial]:
        return [self.trial(e) for e in self.entries]

    def to_env(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_env(cls, text: str) -> Batch:
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
    # The outputs were never compared with the reference: the fleet simulator cannot compute
    # them (a recording counts as checked only when its tuner says it verified). A wrong
    # configuration may then be the fastest. The job on a GPU always verifies (a pruned
    # configuration is not, and says so in `pruned`).
    unverified: bool = False


class TrialResult(_Strict):
    version: Literal[1] = PROTOCOL_VERSION
    outcome: Outcome
    objective: float | None = None  # milliseconds, median of the repeats
    times: list[float] = Field(default_factory=list)
    fingerprint: Fingerprint = Fingerprint()
    error: str = ""
    compile_s: float | None = None
    run_s: float | None = None
    pruned: bool | None = None  # True: timed for PRUNE_RUNS launches only, not verified (prune_above_ms)

    @field_validator("objective")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError("objective must be a positive finite number")
        return v

    def model_post_init(self, __context: Any) -> None:
        if self.outcome == Outcome.OK and self.objective is None:
            raise ValueError("an ok result needs an objective")

    def encode(self) -> str:
        """Compact JSON of at most 4 KiB (drops detail, never the verdict)."""
        doc = self
        text = doc.model_dump_json(exclude_none=True)
        if len(text.encode()) > MAX_MESSAGE_BYTES:
            doc = doc.model_copy(update={"times": doc.times[:16]})
            text = doc.model_dump_json(exclude_none=True)
        while len(text.encode()) > MAX_MESSAGE_BYTES and doc.error:
            doc = doc.model_copy(update={"error": doc.error[: len(doc.error) // 2] + "…"})
            text = doc.model_dump_json(exclude_none=True)
        return text


def _significant(value: float | None, digits: int = 7) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


class Answer(_Strict):
    """One configuration's verdict in a batch: the fields of a :class:`TrialResult`,
    under short names (a whole batch must fit 4 KiB)."""

    i: int = Field(ge=0)  # the entry's index
    o: Outcome
    t: float | None = None  # objective, ms
    ts: list[float] = Field(default_factory=list)  # repeat times, ms (dropped first when short of room)
    e: str = ""  # error
    c: float | None = None  # compile seconds (off the GPU when compiled ahead)
    r: float | None = None  # GPU seconds: first launch to the end of timing
    p: bool | None = None  # pruned

    @field_validator("t")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        return TrialResult._finite(v)

    def model_post_init(self, __context: Any) -> None:
        if self.o == Outcome.OK and self.t is None:
            raise ValueError("an ok answer needs an objective")

    @classmethod
    def of(cls, index: int, result: TrialResult) -> Answer:
        return cls(i=index, o=result.outcome, t=_significant(result.objective),
                   ts=[_significant(t) or 0.0 for t in result.times], e=result.error,
                   c=result.compile_s, r=result.run_s, p=result.pruned)

    def result(self, fingerprint: Fingerprint) -> TrialResult:
        return TrialResult(outcome=self.o, objective=self.t, times=self.ts, fingerprint=fingerprint,
                           error=self.e, compile_s=self.c, run_s=self.r, pruned=self.p)

    def line(self) -> str:
        """The answer as the batch prints it on stdout, the moment it is measured."""
        return ANSWER_PREFIX + self.model_dump_json(exclude_defaults=True)

    @classmethod
    def from_line(cls, line: str) -> Answer | None:
        """The answer a log line carries, or None (another line, or not a valid answer: a
        line the operator cannot trust is only a head start lost)."""
        if not line.startswith(ANSWER_PREFIX) or len(line) > MAX_MESSAGE_BYTES:
            return None
        try:
            return cls.model_validate_json(line[len(ANSWER_PREFIX):])
        except ValueError:
            return None


class BatchResult(_Strict):
    """A batch's verdicts so far; ``done`` once every entry is answered. ``error`` says
    why a batch stopped early (an infrastructure failure: its unanswered entries are
    retried, never recorded as invalid)."""

    version: Literal[1] = PROTOCOL_VERSION
    batch: Literal[True] = True
    answers: list[Answer] = Field(default_factory=list)
    fingerprint: Fingerprint = Fingerprint()
    done: bool = False
    error: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_ANSWERED if self.done else EXIT_STOPPED_EARLY

    def encode(self) -> str:
        """Compact JSON of at most 4 KiB: repeat times go first, then error texts are cut
        (never a verdict: at most MAX_BATCH answers of their short fields fit)."""
        doc = self
        text = doc._compact()
        if len(text.encode()) > MAX_MESSAGE_BYTES:
            doc = doc.model_copy(update={"answers": [a.model_copy(update={"ts": []}) for a in doc.answers]})
            text = doc._compact()
        limit = 200
        while len(text.encode()) > MAX_MESSAGE_BYTES and limit > 0:
            limit //= 2
            answers = [a.model_copy(update={"e": short_error(a.e, limit)}) for a in doc.answers]
            doc = doc.model_copy(update={"answers": answers, "error": short_error(doc.error, limit)})
            text = doc._compact()
        return text

    def _compact(self) -> str:
        body = self.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
        return json.dumps({"version": self.version, "batch": True} | body, separators=(",", ":"),
                          ensure_ascii=False)


def short_error(text: str, limit: int) -> str:
    return text if len(text) <= limit else (text[: max(limit - 1, 0)] + "…" if limit else "")


_M = TypeVar("_M", bound=BaseModel)


class ProtocolError(ValueError):
    """A termination message that is not a valid result: an infrastructure failure."""


def _document(message: str | None) -> dict[str, Any]:
    """A termination message's JSON object of this protocol's version (raises ProtocolError)."""
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
    return raw


def _validated(model: type[_M], raw: dict[str, Any], what: str) -> _M:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "result"
        raise ProtocolError(f"invalid {what}: {where}: {first['msg']}") from None


def decode(message: str | None) -> TrialResult:
    """One configuration's result as the batch worker hands it to its supervisor."""
    return _validated(TrialResult, _document(message), "result")


def decode_batch(message: str | None) -> BatchResult:
    """A batch Pod's termination message (raises ProtocolError like `decode`)."""
    raw = _document(message)
    if raw.get("batch") is not True:
        raise ProtocolError("termination message is not a batch result")
    return _validated(BatchResult, raw, "batch result")


def infra_failure(error: str) -> TrialResult:
    return TrialResult(outcome=Outcome.INFRA_ERROR, error=error[:1000])
