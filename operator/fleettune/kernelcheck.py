"""What the operator can check about a run's kernel before it starts any Job (pure).

A Job that cannot work costs a Pod start and a GPU slot, and ends as an
"infrastructure failure" whose cause only the Pod knows. So the operator checks up
front, with the same expression evaluator and compiler the job uses: the built-in
exists; every expression of a user kernel parses and evaluates with the default
configuration for each problem size; the source ConfigMap and its keys exist; and the
source compiles (NVRTC, ptxas included, no GPU needed) for each pool's architecture and
defines the kernel. Each problem names the field (``spec.kernel.source.arguments[1].length:
…``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from fleettune.api import TuningRunSpec
from fleettune_job.expressions import ExpressionError, evaluate, geometry

# A compute capability for the syntax-and-entry check of a pool whose GPU is unknown.
FALLBACK_CC = "7.5"


class KernelSpecError(ValueError):
    """A problem of the kernel's spec; the message starts with the field's path."""


def check_kernel(spec: TuningRunSpec) -> None:
    """Checks that need no cluster: the built-in's name, and every expression of a user
    kernel evaluated for each problem size (lengths with no parameters, the rest with
    the default configuration)."""
    kernel = spec.kernel
    if kernel.builtin is not None:
        from fleettune_job.kernels import BUILTINS

        if kernel.builtin not in BUILTINS:
            raise KernelSpecError(f"spec.kernel.builtin: unknown built-in kernel {kernel.builtin!r} "
                                  f"(known: {', '.join(sorted(BUILTINS))})")
        return
    source = kernel.user
    assert source is not None
    prefix = user_field(spec)
    if kernel.triton is not None:
        check_launch_options(spec)
    else:
        check_defines(spec)
    config = _numeric(kernel.default_config or {})
    shapes = [("grid", source.grid)] + ([("block", kernel.source.block)] if kernel.source is not None else [])
    for size in kernel.sizes():
        where = f" for problem size {list(size)}" if len(kernel.sizes()) > 1 else ""
        for what, exprs in shapes:
            try:
                dims = geometry(exprs, config, size, what)
            except ExpressionError as exc:
                raise KernelSpecError(f"{prefix}.{what}: {exc}{where}") from None
            if min(dims) < 1:
                raise KernelSpecError(f"{prefix}.{what}: {list(dims)} with kernel.defaultConfig{where}: "
                                      "every dimension must be at least 1")
        for i, arg in enumerate(source.arguments):
            field = f"{prefix}.arguments[{i}]"
            if arg.kind == "array" and arg.length is not None:
                try:
                    n = evaluate(arg.length, {}, size)
                except ExpressionError as exc:
                    raise KernelSpecError(f"{field}.length: {exc} (lengths may use problem_size only){where}") from None
                if isinstance(n, bool) or not float(n).is_integer() or n < 1:
                    raise KernelSpecError(f"{field}.length: {arg.length!r} is {n!r}{where}: a length must be a "
                                          "positive integer")
            elif arg.kind == "scalar" and arg.value is not None:
                try:
                    evaluate(arg.value, config, size)
                except ExpressionError as exc:
                    raise KernelSpecError(f"{field}.value: {exc}{where}") from None


def user_field(spec: TuningRunSpec) -> str:
    """The field path of the run's user source."""
    return "spec.kernel.triton" if spec.kernel.triton is not None else "spec.kernel.source"


def check_launch_options(spec: TuningRunSpec) -> None:
    """Triton's launch options, where the spec tunes or sets them, must be integers it accepts."""
    from fleettune_job.tritonsource import LAUNCH_OPTIONS

    least = {"num_stages": 0, "maxnreg": 16}
    values = [(f"spec.parameters[{i}].values", p.name, list(p.values or [])) for i, p in enumerate(spec.parameters)]
    values += [(f"spec.kernel.defaultConfig.{k}", k, [v]) for k, v in (spec.kernel.default_config or {}).items()]
    for field, name, given in values:
        if name not in LAUNCH_OPTIONS:
            continue
        for value in given:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= least.get(name, 1)
            if ok and name == "num_warps":
                ok = value & (value - 1) == 0
            if not ok:
                rule = "a power of two" if name == "num_warps" else f"an integer of at least {least.get(name, 1)}"
                raise KernelSpecError(f"{field}: {name} = {value!r}: Triton's {name} is {rule}")


def check_triton_source(spec: TuningRunSpec, text: str) -> None:
    """The Triton module, read without running it: the function and the reference exist,
    take the spec's arguments in order, and every tuned name is one of its meta-parameters or
    a launch option; a meta-parameter without a default needs a value."""
    from fleettune_job.tritonsource import LAUNCH_OPTIONS, TritonSourceError, signature

    triton = spec.kernel.triton
    assert triton is not None
    names = [a.name for a in triton.arguments]
    functions = [("function", triton.function)]
    if triton.verification.reference_function:
        functions.append(("verification.referenceFunction", triton.verification.reference_function))
    for field, function in functions:
        try:
            sig = signature(text, function)
        except TritonSourceError as exc:
            raise KernelSpecError(f"spec.kernel.triton.{field}: {exc}") from None
        if list(sig.arguments) != names:
            raise KernelSpecError(f"spec.kernel.triton.arguments: {function} takes ({', '.join(sig.arguments)}) "
                                  f"before its meta-parameters; the spec gives ({', '.join(names)})")
        if field != "function":
            continue
        for i, param in enumerate(spec.parameters):
            if param.name not in sig.meta and param.name not in LAUNCH_OPTIONS:
                known = ", ".join([*sig.meta, *LAUNCH_OPTIONS])
                raise KernelSpecError(f"spec.parameters[{i}].name: {param.name!r} is neither a tl.constexpr "
                                      f"parameter of {function} nor a launch option (known: {known})")
        given = {p.name for p in spec.parameters} | set(spec.kernel.default_config or {})
        missing = [m for m, has_default in sig.meta.items() if not has_default and m not in given]
        if missing:
            raise KernelSpecError(f"spec.kernel.defaultConfig: meta-parameter {missing[0]!r} of {function} has no "
                                  "default: tune it in spec.parameters or give it in kernel.defaultConfig")


def check_defines(spec: TuningRunSpec) -> None:
    """Every parameter of CUDA source becomes a ``#define``: a name or value that cannot be one
    would fail every trial, so it fails the run now, naming the field."""
    from fleettune_job import nvrtc
    from fleettune_job.kernels.base import define_value

    for i, param in enumerate(spec.parameters):
        field = f"spec.parameters[{i}]"
        problem = nvrtc.define_name_problem(param.name)
        if problem is not None:
            raise KernelSpecError(f"{field}.name: {problem}; rename the parameter")
        if param.type == "permutation":
            raise KernelSpecError(f"{field}.type: a permutation cannot be a #define of CUDA source (parameter "
                                  f"{param.name!r}); use one ordinal parameter per position")
        for j, value in enumerate(param.values or []):
            try:
                define_value(param.name, value)
            except ValueError as exc:
                raise KernelSpecError(f"{field}.values[{j}]: {exc} (a #define value is a number, true/false "
                                      "or a C identifier)") from None
    for name, value in (spec.kernel.default_config or {}).items():
        field = f"spec.kernel.defaultConfig.{name}"
        problem = nvrtc.define_name_problem(name)
        if problem is not None:
            raise KernelSpecError(f"{field}: {problem}")
        try:
            define_value(name, value)
        except ValueError as exc:
            raise KernelSpecError(f"{field}: {exc} (a #define value is a number, true/false or a C identifier)") \
                from None


def check_source_data(spec: TuningRunSpec, data: Mapping[str, str] | None) -> str:
    """The source text from its ConfigMap's data (None: the ConfigMap does not exist)."""
    source = spec.kernel.user
    assert source is not None
    prefix = user_field(spec)
    if data is None:
        raise KernelSpecError(f"{prefix}.configMap: ConfigMap {source.config_map!r} not found "
                              "in the run's namespace")
    if source.key not in data:
        raise KernelSpecError(f"{prefix}.key: ConfigMap {source.config_map!r} has no key "
                              f"{source.key!r} (keys: {', '.join(sorted(data)[:10]) or 'none'})")
    for i, arg in enumerate(source.arguments):
        if arg.init == "data" and arg.data_key and arg.data_key not in data:
            raise KernelSpecError(f"{prefix}.arguments[{i}].dataKey: ConfigMap {source.config_map!r} "
                                  f"has no key {arg.data_key!r}")
    return data[source.key]


def compile_check(spec: TuningRunSpec, source_text: str, compute_capability: str | None,
                  problem_size: Sequence[int]) -> str | None:
    """None when the source compiles for the GPU with the default configuration and
    defines the kernel; else the problem, naming the field. None also when no compiler
    is installed (the Job then reports compile errors itself)."""
    from fleettune_job import nvrtc

    if spec.kernel.triton is not None:
        return triton_compile_check(spec, source_text, compute_capability)
    source = spec.kernel.source
    assert source is not None
    if not nvrtc.available():
        return None
    from fleettune_job.prepare import user_program

    config = spec.kernel.default_config or {}
    try:
        code, options = user_program(source_text, config, problem_size)
    except ValueError as exc:
        return f"spec.kernel.defaultConfig: {exc}"
    cc = compute_capability or FALLBACK_CC
    problem = _cached_check(code, options, source.function, cc)
    if problem is None and source.verification.reference_function:
        problem = _cached_check(code, options, source.verification.reference_function, cc)
        if problem is not None:
            return f"spec.kernel.source.verification.referenceFunction: {problem}"
    if problem is None:
        return None
    arch = f"sm_{cc.replace('.', '')}" + ("" if compute_capability else " (the pool's GPU is unknown)")
    hint = member_hint(problem, source_text, config)
    return f"spec.kernel.source: with kernel.defaultConfig, for {arch}: {problem}{hint}"


def triton_compile_check(spec: TuningRunSpec, source_text: str, compute_capability: str | None) -> str | None:
    """:func:`compile_check` for Triton source: it matches the spec (:func:`check_triton_source`),
    the default configuration compiles and its shared memory fits the GPU's per-block limit.
    Without Triton installed, only the first is checked."""
    from fleettune.space import SpaceError, lookup_device
    from fleettune_job import tritonsource

    triton = spec.kernel.triton
    assert triton is not None
    try:
        check_triton_source(spec, source_text)
    except KernelSpecError as exc:
        return str(exc)
    if not tritonsource.available():
        return None
    cc = compute_capability or FALLBACK_CC
    arguments = [(a.kind, a.dtype) for a in triton.arguments]
    request = tritonsource.CompileRequest.of(source_text, triton.function, arguments, spec.kernel.default_config or {},
                                             cc)
    try:
        result = _cached_triton(request)
    except (tritonsource.TritonSourceError, RuntimeError) as exc:
        return f"spec.kernel.triton: {exc}"
    arch = f"sm_{cc.replace('.', '')}" + ("" if compute_capability else " (the pool's GPU is unknown)")
    if result.error is not None:
        return f"spec.kernel.triton: with kernel.defaultConfig, for {arch}: {result.error}"
    try:
        limit = lookup_device(compute_capability=cc).shared_memory_per_block_optin
    except SpaceError:
        return None
    if result.shared_bytes > limit:
        return (f"spec.kernel.defaultConfig: the kernel needs {result.shared_bytes} bytes of shared memory per "
                f"block for {arch}, which allows {limit}")
    return None


@lru_cache(maxsize=64)
def _cached_triton(request: Any) -> Any:
    from fleettune_job import tritonsource

    return tritonsource.compile_check(request)


def member_hint(problem: str, source_text: str, config: Mapping[str, Any]) -> str:
    """What a compile error means when it stems from a parameter's ``#define`` replacing a member
    name (a parameter ``x`` turns ``threadIdx.x`` into ``threadIdx.32``), else ''."""
    if "expected a member name" not in problem:
        return ""
    used = [name for name in config if re.search(rf"(?:\.|->)\s*{re.escape(name)}\b", source_text)]
    if not used:
        return ""
    name = used[0]
    return (f" (parameter {name!r} is a #define: it replaces every {name} of the source, the member name in "
            f"'.{name}' too; rename the parameter)")


@lru_cache(maxsize=64)
def _cached_check(source_text: str, options: tuple[str, ...], function: str, cc: str) -> str | None:
    from fleettune_job import nvrtc

    return nvrtc.check_kernel(source_text, options, function, cc)


def _numeric(config: Mapping[str, Any]) -> dict[str, int | float | bool]:
    return {k: v for k, v in config.items() if isinstance(v, int | float | bool)}
