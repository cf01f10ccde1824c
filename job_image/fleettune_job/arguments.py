"""A user kernel's arguments: from the trial's declarations to host data, with numpy only.

Array lengths depend on ``problem_size`` alone and the data is seeded, so every
configuration of a run (and the reference) is fed exactly the same bytes; scalar values
may depend on the configuration and are resolved per launch. Everything here runs
without a GPU: the runner copies the host arrays to the device.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_job.classify import TrialSpecError
from fleettune_job.expressions import ExpressionError, Number, dimension, evaluate
from fleettune_job.protocol import Argument

# Seed of an argument without its own: the base plus its position in the argument list.
BASE_SEED = 20240607
# All arrays of a trial together, on the host and again on the device (twice with a reference).
MAX_ARRAY_BYTES = 4 << 30
# Data files come from a ConfigMap (1 MiB); the bound only guards local runs against a wrong path.
MAX_DATA_FILE_BYTES = 64 << 20
RANDOM_INT_HIGH = 100  # integers are drawn from 0..99

_SEPARATORS = re.compile(r"[\s,]+")


@dataclass(frozen=True)
class ArraySpec:
    """A device buffer, resolved for one problem size."""

    name: str
    dtype: np.dtype[Any]
    length: int
    init: str
    seed: int
    constant: float | None = None
    data: np.ndarray[Any, Any] | None = field(default=None, compare=False, repr=False)
    output: bool = False

    @property
    def nbytes(self) -> int:
        return self.length * self.dtype.itemsize


@dataclass(frozen=True)
class ScalarSpec:
    """A by-value parameter; ``value`` is an expression evaluated per configuration."""

    name: str
    dtype: np.dtype[Any]
    value: str


KernelArgument = ArraySpec | ScalarSpec


def resolve_arguments(arguments: Sequence[Argument], problem_size: Sequence[int]) -> tuple[KernelArgument, ...]:
    """Check the declarations, evaluate lengths and read ``data`` files.

    Nothing here depends on the configuration, so every failure is the trial's
    (:class:`TrialSpecError`): it would fail the same way for every configuration.
    """
    names = [a.name for a in arguments]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TrialSpecError(f"kernel.arguments: duplicate name(s) {', '.join(duplicates)}")
    resolved: list[KernelArgument] = []
    for position, arg in enumerate(arguments):
        dtype = np.dtype(arg.dtype)
        if arg.kind == "scalar":
            if arg.value is None:
                raise TrialSpecError(f"argument {arg.name}: a scalar needs a value")
            if arg.output:
                raise TrialSpecError(f"argument {arg.name}: a scalar cannot be an output")
            resolved.append(ScalarSpec(arg.name, dtype, arg.value))
            continue
        length = array_length(arg, problem_size)
        if arg.seed is not None and arg.seed < 0:
            raise TrialSpecError(f"argument {arg.name}: seed {arg.seed} is negative")
        data = None
        if arg.init == "constant":
            if arg.constant is None:
                raise TrialSpecError(f"argument {arg.name}: init constant needs a constant")
            try:
                cast_scalar(arg.constant, dtype)
            except ValueError as exc:
                raise TrialSpecError(f"argument {arg.name}: constant {exc}") from None
        elif arg.init == "data":
            if not arg.data_path:
                raise TrialSpecError(f"argument {arg.name}: init data needs a data_path")
            data = read_data(arg.name, Path(arg.data_path), dtype, length)
        seed = BASE_SEED + position if arg.seed is None else arg.seed
        resolved.append(ArraySpec(arg.name, dtype, length, arg.init, seed, arg.constant, data, arg.output))
    total = sum(a.nbytes for a in resolved if isinstance(a, ArraySpec))
    if total > MAX_ARRAY_BYTES:
        raise TrialSpecError(
            f"kernel.arguments: the arrays need {total / 2**30:.2f} GiB, more than the "
            f"{MAX_ARRAY_BYTES / 2**30:g} GiB a trial may allocate"
        )
    if not any(isinstance(a, ArraySpec) and a.output for a in resolved):
        raise TrialSpecError("kernel.arguments: no array is an output, so nothing could be verified")
    return tuple(resolved)


def array_length(arg: Argument, problem_size: Sequence[int]) -> int:
    if arg.length is None:
        raise TrialSpecError(f"argument {arg.name}: an array needs a length")
    try:
        # No parameter names: every configuration must solve the same problem.
        length = dimension(arg.length, {}, problem_size, f"length of {arg.name}")
    except ExpressionError as exc:
        raise TrialSpecError(f"argument {arg.name}: {exc} (a length may use problem_size only)") from None
    if length < 1:
        raise TrialSpecError(f"argument {arg.name}: length {arg.length!r} is {length}, not at least 1")
    return length


def cast_scalar(value: Number, dtype: np.dtype[Any]) -> np.generic:
    """``value`` as a numpy scalar of ``dtype``; ValueError when it does not fit."""
    if isinstance(value, bool):
        value = int(value)
    if dtype.kind in "iu":
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{value!r} is not an integer ({dtype.name})")
            value = int(value)
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{value} is out of range for {dtype.name} ({info.min}..{info.max})")
        return dtype.type(value)
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{value} overflows {dtype.name}") from None
    with np.errstate(over="ignore"):
        cast = dtype.type(value)
    if math.isfinite(value) and not np.isfinite(cast):
        raise ValueError(f"{value!r} overflows {dtype.name}")
    return cast


def scalar_values(arguments: Sequence[KernelArgument], names: Mapping[str, Number],
                  problem_size: Sequence[int]) -> dict[str, np.generic]:
    """The scalars for one configuration; ValueError (ExpressionError included) names the argument."""
    out: dict[str, np.generic] = {}
    for arg in arguments:
        if isinstance(arg, ScalarSpec):
            try:
                value = evaluate(arg.value, names, problem_size)
                if not isinstance(value, int | float):
                    raise ValueError(f"{arg.value!r} is not a number")
                out[arg.name] = cast_scalar(value, arg.dtype)
            except ValueError as exc:
                raise ValueError(f"argument {arg.name}: {exc}") from None
    return out


def read_data(name: str, path: Path, dtype: np.dtype[Any], length: int) -> np.ndarray[Any, Any]:
    """The numbers of a data file (whitespace- or comma-separated) as ``length`` elements of ``dtype``."""
    try:
        size = path.stat().st_size
        if size > MAX_DATA_FILE_BYTES:
            raise TrialSpecError(f"argument {name}: data file {path} is larger than {MAX_DATA_FILE_BYTES} bytes")
        text = path.read_text()
    except OSError as exc:
        raise TrialSpecError(f"argument {name}: cannot read data file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TrialSpecError(f"argument {name}: data file {path} is not text") from None
    tokens = [t for t in _SEPARATORS.split(text) if t]
    if len(tokens) != length:
        raise TrialSpecError(f"argument {name}: data file {path} holds {len(tokens)} numbers, length is {length}")
    integer = dtype.kind in "iu"
    values: list[int | float] = []
    for i, token in enumerate(tokens, 1):
        try:
            # Integers parsed as such: int64 values beyond 2**53 would not survive a float.
            number: int | float = int(token) if integer else float(token)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise TrialSpecError(f"argument {name}: data file {path}, number {i}: {token!r} is not {kind}") from None
        try:
            cast_scalar(number, dtype)
        except ValueError as exc:
            raise TrialSpecError(f"argument {name}: data file {path}, number {i}: {exc}") from None
        values.append(number)
    if integer:
        return np.array(values, dtype=dtype)
    return np.array(values, dtype=np.float64).astype(dtype)


def initial_array(spec: ArraySpec) -> np.ndarray[Any, Any]:
    """The host data of one array, the same for every configuration."""
    if spec.init == "zeros":
        return np.zeros(spec.length, dtype=spec.dtype)
    if spec.init == "constant":
        assert spec.constant is not None
        return np.full(spec.length, cast_scalar(spec.constant, spec.dtype), dtype=spec.dtype)
    if spec.init == "data":
        assert spec.data is not None
        return spec.data.copy()
    rng = np.random.default_rng(spec.seed)
    if spec.dtype.kind in "iu":
        return rng.integers(0, RANDOM_INT_HIGH, size=spec.length, dtype=spec.dtype)
    if spec.dtype == np.float64:
        return rng.random(spec.length, dtype=np.float64)
    # Drawn in float32 (no float64 intermediate of several GiB); float16 rounds from it.
    return rng.random(spec.length, dtype=np.float32).astype(spec.dtype, copy=False)


def initial_arrays(arguments: Sequence[KernelArgument]) -> dict[str, np.ndarray[Any, Any]]:
    return {a.name: initial_array(a) for a in arguments if isinstance(a, ArraySpec)}
