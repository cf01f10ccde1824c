"""What a built-in kernel is: its tunable parameters, constraints, geometry and problem.

A :class:`KernelDescriptor` is plain data plus a :class:`Problem`, the part that knows
the kernel's arguments, how to fill its inputs and how to compute the expected output.
Problems are written against an array module ``xp`` (numpy or cupy) so that the very
same reference code runs on the GPU inside the job and on the CPU in unit tests.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any, ClassVar

import numpy as np

from fleettune_job.expressions import evaluate, geometry

# float32 represents every integer up to 2**24 exactly: inputs are small integers so
# that every summation order a configuration may choose gives bit-identical sums.
FLOAT32_EXACT_LIMIT = 2**24

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Parameter:
    name: str
    values: tuple[int, ...]
    default: int
    doc: str

    def __post_init__(self) -> None:
        if self.default not in self.values:
            raise ValueError(f"default {self.default} of {self.name} not in its values")


@dataclass(frozen=True)
class Constraint:
    """A restriction of the search space, as an expression over parameters and ``problem_size``.

    ``enforced`` constraints are checked by the job before compiling, because breaking
    them would make the kernel compute garbage (or read out of bounds). The others are
    hardware limits (threads per block, shared memory): the job leaves them to the GPU so
    that the trial reports the real compile or launch failure; they are listed so the
    operator can prune its search space up front.
    """

    expr: str
    doc: str
    enforced: bool = False

    def holds(self, config: Mapping[str, Any], problem_size: Sequence[int]) -> bool:
        return bool(evaluate(self.expr, config, problem_size))


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]


class Problem(ABC):
    """The computation a kernel implements, independent of the configuration."""

    #: meaning of each ``problem_size`` entry, e.g. ``("width", "height")``
    dims: tuple[str, ...]
    #: the function of ``kernels/verify.cu`` that computes :meth:`reference` on the GPU
    #: without cupy's run-time compiled kernels (``fleettune_job.verification``); None: only the array code
    reference_kernel: ClassVar[str | None] = None

    def validate(self, problem_size: Sequence[int]) -> None:
        if len(problem_size) != len(self.dims):
            raise ValueError(
                f"problem_size needs {len(self.dims)} entries ({', '.join(self.dims)}), got {list(problem_size)}"
            )
        if any(int(n) < 1 for n in problem_size):
            raise ValueError(f"problem_size entries must be positive, got {list(problem_size)}")

    @abstractmethod
    def defines(self, problem_size: Sequence[int], config: Mapping[str, int]) -> dict[str, int]:
        """Compile-time constants derived from the problem size (besides the configuration)."""

    @abstractmethod
    def inputs(self, problem_size: Sequence[int], config: Mapping[str, int]) -> list[Tensor]:
        """Input tensors (float32), in kernel-argument order after the output."""

    @abstractmethod
    def output(self, problem_size: Sequence[int]) -> Tensor:
        """The output tensor (float32), the kernel's first argument."""

    @abstractmethod
    def fill(self, tensor: Tensor, rng: np.random.Generator) -> np.ndarray:
        """Host data for an input tensor."""

    @abstractmethod
    def reference(self, xp: Any, inputs: Mapping[str, Any], problem_size: Sequence[int]) -> Any:
        """Expected output, computed in float64 with the array module ``xp``."""

    @abstractmethod
    def tolerance(self, problem_size: Sequence[int], config: Mapping[str, int]) -> float:
        """Largest acceptable absolute error per element."""

    def constants(self, config: Mapping[str, int]) -> dict[str, str]:
        """``__constant__`` symbols to fill before launching: symbol name -> input tensor name."""
        return {}

    def flops(self, problem_size: Sequence[int], config: Mapping[str, int]) -> float:
        """Floating-point operations of one launch (for logs: GFLOP/s)."""
        return 0.0


@dataclass(frozen=True)
class KernelDescriptor:
    name: str
    summary: str
    source_file: str
    function: str
    parameters: tuple[Parameter, ...]
    constraints: tuple[Constraint, ...]
    problem_size: tuple[int, ...]
    grid: tuple[str, ...]
    block: tuple[str, ...]
    problem: Problem = field(compare=False)
    signature: str = ""

    @cached_property
    def source(self) -> str:
        return resources.files("fleettune_job.kernels").joinpath(self.source_file).read_text()

    @property
    def default_config(self) -> dict[str, int]:
        return {p.name: p.default for p in self.parameters}

    def resolve(self, config: Mapping[str, Any]) -> dict[str, int]:
        """Defaults overridden by ``config``; unknown parameters are an error, not ignored.

        A parameter the kernel does not read would let a tuner believe it matters.
        """
        known = {p.name for p in self.parameters}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(
                f"unknown parameter(s) {', '.join(unknown)} for built-in kernel {self.name} "
                f"(known: {', '.join(sorted(known))})"
            )
        merged = self.default_config
        for key, value in config.items():
            merged[key] = as_int(key, value)
        return merged

    def violations(self, config: Mapping[str, int], problem_size: Sequence[int]) -> list[Constraint]:
        """The first enforced constraint that fails, in declaration order.

        Stopping there matters: later constraints may divide by sizes an earlier one
        already found to be zero.
        """
        for c in self.constraints:
            if c.enforced and not c.holds(config, problem_size):
                return [c]
        return []

    def launch_geometry(
        self, config: Mapping[str, int], problem_size: Sequence[int]
    ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        return (
            geometry(self.grid, config, problem_size, "grid"),
            geometry(self.block, config, problem_size, "block"),
        )

    def describe(self) -> dict[str, Any]:
        """JSON-able description for the operator, the CLI and the docs."""
        return {
            "name": self.name,
            "summary": self.summary,
            "function": self.function,
            "signature": self.signature,
            "problem_size": list(self.problem_size),
            "problem_dims": list(self.problem.dims),
            "parameters": [
                {"name": p.name, "values": list(p.values), "default": p.default, "doc": p.doc}
                for p in self.parameters
            ],
            "constraints": [
                {"expr": c.expr, "doc": c.doc, "enforced": c.enforced} for c in self.constraints
            ],
            "grid": list(self.grid),
            "block": list(self.block),
        }


def as_int(name: str, value: Any) -> int:
    """Built-in kernels take integer parameters only (booleans become 0/1)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value)
    raise ValueError(f"parameter {name} must be an integer, got {value!r}")


def define_value(name: str, value: Any) -> str:
    """Render a parameter as the value of an NVRTC ``-D`` define, refusing anything odd.

    Values are restricted to numbers and identifiers so that a configuration can never
    smuggle extra compiler options or source text into the build.
    """
    if not _IDENTIFIER.match(name):
        raise ValueError(f"parameter name {name!r} is not a C identifier")
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not np.isfinite(value):
            raise ValueError(f"parameter {name} is not finite: {value!r}")
        return repr(value) + "f" if not value.is_integer() else str(int(value))
    if isinstance(value, str) and (_IDENTIFIER.match(value) or re.fullmatch(r"[+-]?\d+(\.\d+)?", value)):
        return value
    raise ValueError(f"parameter {name} has a value that cannot be a compile-time constant: {value!r}")


def compare(xp: Any, got: Any, expected: Any, atol: float, rtol: float = 0.0, *,
            nan_is_unwritten: bool = True) -> str | None:
    """None when every element of ``got`` is within ``atol + rtol * |expected|`` of
    ``expected`` (in float64), else a short diagnosis.

    NaN counts as wrong unless the expected element is NaN too. Built-in outputs are
    pre-filled with NaN (``nan_is_unwritten``), so an element the kernel never wrote shows
    up here instead of passing by luck.
    """
    if tuple(got.shape) != tuple(expected.shape):
        return f"output shape {tuple(got.shape)} != expected {tuple(expected.shape)}"
    got64 = got.astype(xp.float64, copy=False)
    exp64 = expected.astype(xp.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: settled by the equality below
        diff = xp.abs(got64 - exp64)
        # rtol * inf would let anything but NaN match an infinite reference.
        ok = (diff <= atol + rtol * xp.abs(exp64)) & xp.isfinite(exp64)
    ok |= got64 == exp64
    ok |= xp.isnan(got64) & xp.isnan(exp64)
    bad = ~ok
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    flat = int(xp.argmax(bad.ravel().astype(xp.uint8)))
    unwritten = int(xp.isnan(got64).sum()) if nan_is_unwritten else 0
    return describe_mismatch(tuple(got.shape), n_bad, flat, float(got64.ravel()[flat]), float(exp64.ravel()[flat]),
                             atol, rtol, unwritten)


def describe_mismatch(shape: tuple[int, ...], n_bad: int, flat: int, got: float, expected: float,
                      atol: float, rtol: float, unwritten: int) -> str:
    """:func:`compare`'s diagnosis: how many elements are wrong, the first (at flat index
    ``flat``) with its values, and how many were never written (NaN), when counted."""
    where = [int(i) for i in np.unravel_index(flat, shape)]
    tolerance = f"tolerance {atol:g}" + (f" + {rtol:g} x |expected|" if rtol else "")
    size = int(np.prod(shape))
    text = f"{n_bad} of {size} elements wrong ({tolerance}); first at {where}: got {got:g}, expected {expected:g}"
    if unwritten:
        text += f"; {unwritten} never written"
    return text
