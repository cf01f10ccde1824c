"""From a trial to everything needed to build and launch it, without touching the GPU.

A trial names a built-in kernel, or user CUDA source (a mounted ConfigMap key). User
source either declares its own interface (``kernel.arguments``: what to allocate and pass,
``kernel.verification``: the reference configuration whose outputs every configuration
must reproduce), or implements the interface of a built-in, which then supplies the
argument list, the input data, the reference result and, unless the trial gives its own,
the launch geometry. Without an interface the job could neither feed nor check a user
kernel, and a fast wrong kernel would win the tuning run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_job import nvrtc
from fleettune_job.arguments import ArraySpec, KernelArgument, resolve_arguments, scalar_values
from fleettune_job.classify import GeometryError, InvalidConfiguration, TrialSpecError
from fleettune_job.expressions import ExpressionError, Number, geometry
from fleettune_job.kernels import BUILTINS, KernelDescriptor, Problem
from fleettune_job.kernels.base import as_int, define_value
from fleettune_job.protocol import KernelRef, Trial

MAX_SOURCE_BYTES = 1 << 20


class _Launchable:
    """What both built-in and user builds derive from their source, defines and block size."""

    source: str
    function: str
    defines: dict[str, str]
    block: tuple[int, int, int]

    @property
    def code(self) -> str:
        """What is compiled: the source with the defines written into it (:func:`nvrtc.program`)."""
        return nvrtc.program(self.source, self.defines)

    @property
    def options(self) -> tuple[str, ...]:
        """The compile options of the job's own (cupy adds its :func:`nvrtc.cupy_options`)."""
        return nvrtc.header_options()

    @property
    def key(self) -> str:
        """Names the module this builds: the same code, options and function build the same
        module (the worker's module cache and the cubins compiled ahead go by it)."""
        digest = hashlib.sha256(self.code.encode())
        for part in (*self.options, self.function):
            digest.update(b"\0" + part.encode())
        return digest.hexdigest()[:32]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Prepared(_Launchable):
    label: str  # for logs and error texts
    source: str
    function: str
    config: dict[str, int]  # values the problem reads (filter sizes, use_cmem, ...)
    defines: dict[str, str]  # name -> rendered value, #defined in the code
    problem_size: tuple[int, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    problem: Problem
    descriptor: KernelDescriptor


@dataclass(frozen=True)
class KernelBuild(_Launchable):
    """One compile and launch of a user kernel: the candidate configuration, or the reference."""

    source: str
    function: str
    defines: dict[str, str]  # name -> rendered value, #defined in the code
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    scalars: dict[str, np.generic]  # by-value arguments, by name


@dataclass(frozen=True)
class PreparedUser:
    """A user kernel with its own interface: arguments, candidate and reference builds."""

    label: str
    config: dict[str, Any]
    problem_size: tuple[int, ...]
    arguments: tuple[KernelArgument, ...]
    candidate: KernelBuild
    reference: KernelBuild | None  # None: the candidate is the reference, nothing to compare
    atol: float
    rtol: float

    @property
    def outputs(self) -> tuple[ArraySpec, ...]:
        return tuple(a for a in self.arguments if isinstance(a, ArraySpec) and a.output)


def prepare(trial: Trial) -> Prepared | PreparedUser:
    ref = trial.kernel
    if ref.language == "triton":
        # Checked, compiled and simulated before any Job; measuring one needs Triton's launcher
        # in this image, which it does not carry yet.
        raise TrialSpecError("this job image runs built-in kernels and CUDA source; it cannot measure a Triton "
                             "kernel")
    if ref.arguments is not None:
        if ref.builtin:
            raise TrialSpecError("kernel.arguments declare a user kernel's own interface: kernel.builtin must be unset")
        return _prepare_user_kernel(trial)
    if ref.verification is not None:
        raise TrialSpecError("kernel.verification applies to user kernels with kernel.arguments only")
    if not ref.builtin:
        raise TrialSpecError(
            "kernel.builtin is required unless kernel.arguments declare the user kernel's interface: it names "
            "the built-in kernel, or for user source the built-in interface the source implements (one of: "
            f"{', '.join(sorted(BUILTINS))})"
        )
    desc = BUILTINS.get(ref.builtin)
    if desc is None:
        raise TrialSpecError(f"unknown built-in kernel {ref.builtin!r} (known: {', '.join(sorted(BUILTINS))})")

    problem_size = tuple(int(n) for n in trial.problem_size) or desc.problem_size
    try:
        desc.problem.validate(problem_size)
    except ValueError as exc:
        raise TrialSpecError(f"{desc.name}: {exc}") from None

    if ref.source_path:
        return _prepare_user_source(trial, desc, problem_size)
    return _prepare_builtin(trial, desc, problem_size)


def _prepare_builtin(trial: Trial, desc: KernelDescriptor, problem_size: tuple[int, ...]) -> Prepared:
    ref = trial.kernel
    if ref.grid or ref.block or (ref.function and ref.function != desc.function):
        raise TrialSpecError("kernel.function/grid/block apply to user source (kernel.source_path) only")
    try:
        config = desc.resolve(trial.config)
    except ValueError as exc:
        raise InvalidConfiguration(str(exc)) from None
    try:
        broken = desc.violations(config, problem_size)
    except ExpressionError as exc:
        raise InvalidConfiguration(f"cannot check constraints: {exc}") from None
    if broken:
        raise InvalidConfiguration(
            "configuration violates " + "; ".join(f"{c.expr} ({c.doc})" for c in broken)
        )
    return _finish(desc, desc.source, desc.function, f"builtin {desc.name}", config, config,
                   desc.grid, desc.block, problem_size)


def _read_source(path: Path, sha256: str | None = None) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        # A missing ConfigMap mount is the Pod's problem, not the configuration's.
        raise TrialSpecError(f"cannot read kernel source {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_SOURCE_BYTES:
        raise TrialSpecError(f"kernel source {path} is larger than {MAX_SOURCE_BYTES} bytes")
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        # The ConfigMap was edited after the operator checked it: not this configuration's fault.
        raise TrialSpecError(f"kernel source {path} changed since the run checked it (sha256 {sha256[:12]}…)")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise TrialSpecError(f"kernel source {path} is not UTF-8") from None


def _expression_names(config: Mapping[str, Any]) -> dict[str, Number]:
    """The configuration entries expressions can use: numbers, and booleans as 0/1."""
    numeric: dict[str, Number] = {
        k: v for k, v in config.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    numeric |= {k: int(v) for k, v in config.items() if isinstance(v, bool)}
    return numeric


def _prepare_user_source(trial: Trial, desc: KernelDescriptor, problem_size: tuple[int, ...]) -> Prepared:
    ref = trial.kernel
    path = Path(ref.source_path or "")
    source = _read_source(path, ref.source_sha256)

    # The interface's own parameters (filter sizes, use_cmem, ...) keep the built-in's
    # defaults unless the configuration sets them; every other entry is the user's.
    known = {p.name for p in desc.parameters}
    try:
        problem_config = desc.default_config | {
            k: as_int(k, v) for k, v in trial.config.items() if k in known
        }
    except ValueError as exc:
        raise InvalidConfiguration(str(exc)) from None
    defines: dict[str, Any] = dict(problem_config) | dict(trial.config)
    numeric = _expression_names(defines)
    return _finish(desc, source, ref.function or desc.function, f"{path.name} ({desc.name} interface)",
                   problem_config, defines, tuple(ref.grid or desc.grid), tuple(ref.block or desc.block),
                   problem_size, names=numeric)


def _finish(
    desc: KernelDescriptor,
    source: str,
    function: str,
    label: str,
    config: dict[str, int],
    defines: Mapping[str, Any],
    grid_exprs: tuple[str, ...],
    block_exprs: tuple[str, ...],
    problem_size: tuple[int, ...],
    names: Mapping[str, Any] | None = None,
) -> Prepared:
    names = config if names is None else names
    try:
        grid = geometry(grid_exprs, names, problem_size, "grid")
        block = geometry(block_exprs, names, problem_size, "block")
    except ExpressionError as exc:
        raise GeometryError(f"launch geometry: {exc}") from None

    all_defines: dict[str, Any] = dict(defines)
    all_defines |= desc.problem.defines(problem_size, config)
    all_defines |= {f"problem_size_{i}": n for i, n in enumerate(problem_size)}
    try:
        rendered = {name: define_value(name, value) for name, value in all_defines.items()}
    except ValueError as exc:
        raise InvalidConfiguration(str(exc)) from None
    return Prepared(
        label=label,
        source=source,
        function=function,
        config=dict(config),
        defines=rendered,
        problem_size=problem_size,
        grid=grid,
        block=block,
        problem=desc.problem,
        descriptor=desc,
    )


def user_defines(config: Mapping[str, Any], problem_size: Sequence[int]) -> dict[str, str]:
    """A user kernel's compile-time defines: every parameter, and ``problem_size_<i>``. The
    operator's up-front compile and the fleet simulator build with exactly these. Raises
    ValueError for a name or value that cannot be a define."""
    for name in config:
        problem = nvrtc.define_name_problem(name)
        if problem is not None:
            raise ValueError(f"parameter name {problem}")
    defines = dict(config) | {f"problem_size_{i}": n for i, n in enumerate(problem_size)}
    return {name: define_value(name, value) for name, value in defines.items()}


def user_program(source: str, config: Mapping[str, Any], problem_size: Sequence[int]) -> tuple[str, tuple[str, ...]]:
    """(code, options): what NVRTC compiles for a user kernel with this configuration, as the
    job's worker compiles it (cupy's additions included; the architecture is the caller's).
    Raises ValueError for a name or value that cannot be a define."""
    return nvrtc.program(source, user_defines(config, problem_size)), nvrtc.job_options(nvrtc.header_options())


def _prepare_user_kernel(trial: Trial) -> PreparedUser:
    ref = trial.kernel
    missing = [name for name in ("source_path", "function", "grid", "block", "verification") if not getattr(ref, name)]
    if missing:
        raise TrialSpecError(f"a user kernel needs {', '.join(f'kernel.{name}' for name in missing)}")
    assert ref.arguments is not None and ref.verification is not None and ref.function
    problem_size = tuple(int(n) for n in trial.problem_size)
    if any(n < 1 for n in problem_size):
        raise TrialSpecError(f"problem_size entries must be positive, got {list(problem_size)}")
    path = Path(ref.source_path or "")
    source = _read_source(path, ref.source_sha256)
    arguments = resolve_arguments(ref.arguments, problem_size)

    check = ref.verification
    # The reference first: when it cannot even be prepared, every configuration would fail
    # the same way, which is the run's problem, not this configuration's.
    try:
        reference = _user_build(source, check.reference_function or ref.function, check.reference_config, ref,
                                arguments, problem_size)
    except (GeometryError, InvalidConfiguration) as exc:
        raise TrialSpecError(f"reference configuration failed: {exc}") from None
    candidate = _user_build(source, ref.function, trial.config, ref, arguments, problem_size)
    return PreparedUser(
        label=f"{path.name}:{ref.function}",
        config=dict(trial.config),
        problem_size=problem_size,
        arguments=arguments,
        candidate=candidate,
        reference=None if reference == candidate else reference,
        atol=check.atol,
        rtol=check.rtol,
    )


def _user_build(source: str, function: str, config: Mapping[str, Any], ref: KernelRef,
                arguments: tuple[KernelArgument, ...], problem_size: tuple[int, ...]) -> KernelBuild:
    names = _expression_names(config)
    try:
        grid = geometry(ref.grid or (), names, problem_size, "grid")
        block = geometry(ref.block or (), names, problem_size, "block")
    except ExpressionError as exc:
        raise GeometryError(f"launch geometry: {exc}") from None
    try:
        rendered = user_defines(config, problem_size)
        scalars = scalar_values(arguments, names, problem_size)
    except ValueError as exc:
        raise InvalidConfiguration(str(exc)) from None
    return KernelBuild(source=source, function=function, defines=rendered, grid=grid, block=block, scalars=scalars)
