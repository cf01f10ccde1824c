"""From a trial to everything needed to build and launch it, without touching the GPU.

A trial names a built-in kernel, or user CUDA source (a mounted ConfigMap key) together
with the built-in whose *interface* it implements: the built-in supplies the argument
list, the input data, the reference result and, unless the trial gives its own, the
launch geometry. Without such an interface the job could neither feed nor check a user
kernel, and a fast wrong kernel would win the tuning run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleettune_job.classify import GeometryError, InvalidConfiguration, TrialSpecError
from fleettune_job.expressions import ExpressionError, geometry
from fleettune_job.kernels import BUILTINS, KernelDescriptor, Problem
from fleettune_job.kernels.base import as_int, define_value
from fleettune_job.protocol import Trial

MAX_SOURCE_BYTES = 1 << 20


@dataclass(frozen=True)
class Prepared:
    label: str  # for logs and error texts
    source: str
    function: str
    config: dict[str, int]  # values the problem reads (filter sizes, use_cmem, ...)
    defines: dict[str, str]  # NVRTC -D name=value
    problem_size: tuple[int, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    problem: Problem
    descriptor: KernelDescriptor

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(f"-D{name}={value}" for name, value in sorted(self.defines.items()))

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


def prepare(trial: Trial) -> Prepared:
    ref = trial.kernel
    if not ref.builtin:
        raise TrialSpecError(
            "kernel.builtin is required: it names the built-in kernel, or for user source the "
            f"built-in interface the source implements (one of: {', '.join(sorted(BUILTINS))})"
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


def _prepare_user_source(trial: Trial, desc: KernelDescriptor, problem_size: tuple[int, ...]) -> Prepared:
    ref = trial.kernel
    path = Path(ref.source_path or "")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        # A missing ConfigMap mount is the Pod's problem, not the configuration's.
        raise TrialSpecError(f"cannot read kernel source {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_SOURCE_BYTES:
        raise TrialSpecError(f"kernel source {path} is larger than {MAX_SOURCE_BYTES} bytes")
    try:
        source = raw.decode()
    except UnicodeDecodeError:
        raise TrialSpecError(f"kernel source {path} is not UTF-8") from None

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
    numeric = {k: v for k, v in defines.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    numeric |= {k: int(v) for k, v in defines.items() if isinstance(v, bool)}
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
