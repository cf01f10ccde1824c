"""Run one trial (a configuration of a batch) on the GPU: find the device, compile, launch, verify, time.

Phases run in a fixed order and every exception is classified by the phase it escaped
from (see :mod:`fleettune_job.classify`). cupy is imported here lazily, inside
functions, so that the package imports on machines without CUDA.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleettune_job import verification
from fleettune_job.arguments import ArraySpec, KernelArgument, initial_arrays
from fleettune_job.classify import NoGpu, Phase, ReferenceFailed, WrongResult, classify, short
from fleettune_job.fingerprint import device_fingerprint, device_limits
from fleettune_job.kernels.base import compare
from fleettune_job.prepare import KernelBuild, Prepared, PreparedUser, prepare
from fleettune_job.protocol import Fingerprint, Outcome, Trial, TrialResult
from fleettune_job.resources import describe_launch
from fleettune_job.timing import can_prune, cuda_event_timer, measure, reported, summarize

# Same data for every trial of a run, so that every configuration solves the same problem.
DATA_SEED = 20240607
# Share of the timeout after which extra repeats for min_duration_s stop.
MEASURE_BUDGET = 0.8

Progress = Callable[[Phase, Fingerprint], None]

# Compiled modules of this process, by build key (source, options and function). Across
# processes cupy's own disk cache (CUPY_CACHE_DIR) avoids recompiling.
_MODULES: dict[str, tuple[Any, Any]] = {}
# Cubins a batch supervisor compiled ahead on the CPU, by build key: (path, compile seconds).
_CUBINS: dict[str, tuple[str, float]] = {}
# A batch's configurations all solve one problem. Drawing its data costs the CPU about
# 0.15 s at 4096 x 4096 and computing its float64 reference about 40 ms of GPU, both while
# the Pod holds the GPU, so the last problem's are kept (one entry each; a user kernel's
# initial data and its reference configuration's outputs alike). The data is kept
# on the host only: every configuration gets fresh device copies, so a faulty kernel cannot
# change what the next one reads. The reference is kept on the device; a configuration it
# rejects is checked again against a fresh one (a faulty kernel may have written over it),
# so keeping it never turns a correct configuration into an invalid one.
_DATA: dict[tuple[Any, ...], dict[str, np.ndarray]] = {}
_REFERENCE: dict[tuple[Any, ...], Any] = {}
# The reference stays on the device only while it is this small a share of the free memory.
REFERENCE_SHARE = 0.25
# The data stays on the host only up to this size: a trial Pod's memory limit is 4 GiB, and
# a larger problem is drawn again for each configuration, as it always was.
DATA_MAX_BYTES = 256 << 20
# Verification runs on the job's own kernels (fleettune_job.verification), compiled once per
# process before its first configuration. Where they do not apply, cupy's array code
# verifies, whose kernels cupy compiles at first use (6 to 8 s for a built-in's on an H200
# with an empty CUPY_CACHE_DIR, as every trial Pod has): those compile then on a problem of
# at most WARM_SIZE per dimension, so that the time is the Pod's start-up, not the first
# configuration's GPU time (`run_s`), which sizes the pool's next batches (docs/decisions.md).
# By verification: problem type, or a user kernel's output dtypes.
WARM_SIZE = 64
_WARMED: set[tuple[str, ...]] = set()


def log(message: str) -> None:
    print(f"fleettune-job: {message}", file=sys.stderr, flush=True)


def load_cupy() -> Any:
    """cupy with at least one usable CUDA device, or :class:`NoGpu` saying why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA library raising at import
        raise NoGpu(f"no GPU: cupy cannot be imported ({type(exc).__name__}: {exc})") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise NoGpu(f"no GPU: the CUDA runtime finds no usable device ({exc})") from None
    if count < 1:
        raise NoGpu("no GPU: no CUDA device is visible to this container")
    return cupy


def use_cubins(cubins: Mapping[str, tuple[str, float]]) -> None:
    """Load these precompiled cubins (build key -> path, compile seconds) instead of compiling."""
    _CUBINS.clear()
    _CUBINS.update(cubins)


def compile_kernel(cupy: Any, prepared: Prepared | KernelBuild) -> tuple[Any, Any, str]:
    """(module, kernel, origin: ``cache``, ``cubin`` or ``nvrtc``). Module load happens here
    too, so loader errors (PTX JIT, too much shared memory) surface in the compile phase."""
    key = prepared.key
    hit = _MODULES.get(key)
    if hit is not None:
        return hit[0], hit[1], "cache"
    loaded = _load_cubin(cupy, prepared, key)
    if loaded is not None:
        origin = "cubin"
    else:
        origin = "nvrtc"
        module = cupy.RawModule(code=prepared.code, options=prepared.options)
        loaded = module, module.get_function(prepared.function)
    _MODULES[key] = loaded
    return loaded[0], loaded[1], origin


def _load_cubin(cupy: Any, prepared: Prepared | KernelBuild, key: str) -> tuple[Any, Any] | None:
    """The module compiled ahead, or None: then the worker compiles, whose verdict is the truth."""
    if key not in _CUBINS:
        return None
    path = _CUBINS[key][0]
    try:
        module = cupy.RawModule(path=path)
        return module, module.get_function(prepared.function)
    except Exception as exc:
        log(f"cubin compiled ahead ({path}) did not load ({type(exc).__name__}: {exc}); compiling here")
        return None


def kernel_resources(kernel: Any) -> dict[str, int]:
    out = {}
    for attr in ("num_regs", "shared_size_bytes", "local_size_bytes", "max_threads_per_block"):
        try:
            out[attr] = int(getattr(kernel, attr))
        except Exception:  # attribute missing in this cupy, or the context is gone
            continue
    return out


@dataclass
class _State:
    phase: Phase = Phase.DEVICE
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    compile_s: float | None = None
    context: str = ""
    run_started: float | None = None  # the first launch: from then on the GPU is this trial's


def run_trial(trial: Trial, progress: Progress | None = None,
              clock: Callable[[], float] = time.monotonic, fingerprint: Fingerprint | None = None) -> TrialResult:
    """Run ``trial`` and return its result; never raises for a failure of the trial.

    ``fingerprint``: the device's, when the caller (a batch worker) already took it.
    """
    started = clock()
    state = _State()

    def enter(phase: Phase) -> None:
        state.phase = phase
        if progress is not None:
            progress(phase, state.fingerprint)

    try:
        enter(Phase.DEVICE)
        cupy = load_cupy()
        state.fingerprint = fingerprint or describe_device(cupy)
        enter(Phase.SETUP)
        prepared = prepare(trial)
        log(f"trial {trial.run}/{trial.target}#{trial.index}: {prepared.label} {prepared.config} "
            f"problem {list(prepared.problem_size)}")
        warm_verification(cupy, prepared)
        if isinstance(prepared, PreparedUser):
            return _execute_user(cupy, trial, prepared, state, enter, started, clock)
        return _execute(cupy, trial, prepared, state, enter, started, clock)
    except Exception as exc:
        outcome, text = classify(exc, state.phase)
        if state.context and outcome in (Outcome.LAUNCH_ERROR, Outcome.RUNTIME_ERROR):
            text = short(f"{text} ({state.context})")
        log(f"{outcome}: {text}")
        run_s = None if state.run_started is None else round(clock() - state.run_started, 3)
        return TrialResult(outcome=outcome, error=text, fingerprint=state.fingerprint,
                           compile_s=state.compile_s, run_s=run_s)


def describe_device(cupy: Any) -> Fingerprint:
    """The device's fingerprint, logged with its limits."""
    fp = device_fingerprint(cupy)
    log(f"device {fp.product} (sm {fp.compute_capability}, driver {fp.driver_version}, "
        f"CUDA runtime {fp.cuda_runtime_version}; {device_limits(cupy)})")
    return fp


_ORIGIN_NOTE = {"cache": " (in-process cache)", "cubin": " (compiled ahead)", "nvrtc": ""}


def _compile(cupy: Any, build: Prepared | KernelBuild, state: _State, clock: Callable[[], float]) -> tuple[Any, Any]:
    t0 = clock()
    module, kernel, origin = compile_kernel(cupy, build)
    # Compiled ahead: the compile took its seconds on the CPU, off the GPU's path.
    ahead = _CUBINS[build.key][1] if origin == "cubin" else 0.0
    state.compile_s = round(clock() - t0 + ahead, 3)
    resources = kernel_resources(kernel)
    state.context = describe_launch(build, resources)
    log(f"compiled in {state.compile_s} s{_ORIGIN_NOTE[origin]}: {resources}")
    return module, kernel


def _execute(cupy: Any, trial: Trial, prepared: Prepared, state: _State,
             enter: Callable[[Phase], None], started: float, clock: Callable[[], float]) -> TrialResult:
    enter(Phase.COMPILE)
    module, kernel = _compile(cupy, prepared, state, clock)

    enter(Phase.ALLOCATE)
    problem = prepared.problem
    tensors = problem.inputs(prepared.problem_size, prepared.config)
    data_key = (type(problem).__module__, type(problem).__qualname__, tuple(prepared.problem_size), tuple(tensors))
    # cupy.array copies (numpy's too): the kept host data is never the kernel's.
    inputs = {name: cupy.array(array) for name, array in _kept_data(data_key, lambda: _draw(problem, tensors)).items()}
    out_t = problem.output(prepared.problem_size)
    # NaN marks elements the kernel never writes, so verification cannot pass by luck.
    output = verification.nan_filled(cupy, out_t.shape)
    args = (output, *inputs.values())

    enter(Phase.COMPILE)
    for symbol, tensor in problem.constants(prepared.config).items():
        memptr = module.get_global(symbol)
        src = inputs[tensor]
        memptr.copy_from_device(src.data, src.nbytes)

    def launch() -> None:
        kernel(prepared.grid, prepared.block, args)

    run_started = _first_launch(cupy, launch, enter, clock, state)

    def verify() -> None:
        # The built-in kernels write their output from inputs they only read: every launch
        # leaves the same output, so it can be checked after the first timed ones.
        enter(Phase.VERIFY)
        tolerance = problem.tolerance(prepared.problem_size, prepared.config)
        mismatch = _check_against_kept(
            cupy, data_key, True, lambda expected: verification.mismatch(cupy, output, expected, tolerance),
            lambda: verification.reference(cupy, problem, inputs, prepared.problem_size),
            lambda expected: expected.nbytes)
        if mismatch:
            raise WrongResult(f"wrong result: {mismatch}")
        enter(Phase.TIME)

    flops = problem.flops(prepared.problem_size, prepared.config)
    if not can_prune(trial.repeats, trial.prune_above_ms):
        verify()
        return _timed(cupy, trial, launch, state, started, run_started, clock, flops)
    enter(Phase.TIME)
    return _timed(cupy, trial, launch, state, started, run_started, clock, flops, verify=verify)


def warm_verification(cupy: Any, prepared: Prepared | PreparedUser) -> None:
    """Compile the kernels that verifying ``prepared`` uses, once per process, in the set-up
    phase: the job's own (``verification.load``), and cupy's array code only where those do not
    apply, on small arrays (see WARM_SIZE). Best effort: a failure only leaves them to
    compile at first use. A hang here is the node's fault, never a verdict."""
    if isinstance(prepared, PreparedUser):
        key: tuple[str, ...] = ("user", *sorted({str(out.dtype) for out in prepared.outputs}))
    else:
        key = (type(prepared.problem).__module__, type(prepared.problem).__qualname__)
    if key in _WARMED:
        return
    _WARMED.add(key)
    module = verification.load(cupy, log)
    started = time.monotonic()
    try:
        if isinstance(prepared, PreparedUser):
            uncovered = [out for out in prepared.outputs
                         if module is None or not verification.covers(out.dtype, out.dtype)]
            if not uncovered:
                return
            for out in uncovered:
                got = cupy.asarray(np.zeros(WARM_SIZE, dtype=out.dtype))
                compare(cupy, got, got.copy(), prepared.atol, prepared.rtol, nan_is_unwritten=False)
        else:
            problem = prepared.problem
            if module is not None and problem.reference_kernel:
                return
            size = [min(int(n), WARM_SIZE) for n in prepared.problem_size]
            data = _draw(problem, problem.inputs(size, prepared.config))
            inputs = {name: cupy.array(array) for name, array in data.items()}
            expected = problem.reference(cupy, inputs, size)
            # The output as a kernel leaves it (float32), through the host: no cast kernel to compile.
            got = cupy.asarray(np.asarray(cupy.asnumpy(expected), dtype=np.float32))
            compare(cupy, got, expected, problem.tolerance(size, prepared.config))
    except Exception as exc:
        log(f"cupy's verification kernels not compiled ahead ({type(exc).__name__}: {exc}): they compile at first use")
        return
    log(f"cupy's verification kernels compiled in {time.monotonic() - started:.2f} s (once per process)")


def _check_against_kept(cupy: Any, key: tuple[Any, ...], keep: bool, mismatch_in: Callable[[Any], str | None],
                        fresh: Callable[[], Any], nbytes: Callable[[Any], int]) -> str | None:
    """``mismatch_in``'s verdict against the reference kept under ``key`` (see _REFERENCE);
    on a mismatch, or with none kept, against a ``fresh`` one, then kept when ``keep`` and
    it fits beside the candidate (``nbytes``)."""
    kept = _REFERENCE.get(key) if keep else None
    if kept is not None and mismatch_in(kept) is None:
        return None
    _REFERENCE.clear()
    expected = fresh()
    mismatch = mismatch_in(expected)
    if keep and _fits_beside(cupy, nbytes(expected)):
        _REFERENCE[key] = expected
    return mismatch


def _draw(problem: Any, tensors: list[Any]) -> dict[str, np.ndarray]:
    """The problem's input data (host arrays), drawn from DATA_SEED: the same for every configuration."""
    rng = np.random.default_rng(DATA_SEED)
    return {t.name: problem.fill(t, rng) for t in tensors}


def _kept_data(key: tuple[Any, ...], draw: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The host data under ``key``, kept (one entry) while at most DATA_MAX_BYTES."""
    data = _DATA.get(key)
    if data is None:
        _DATA.clear()
        data = draw()
        if sum(a.nbytes for a in data.values()) <= DATA_MAX_BYTES:
            _DATA[key] = data
    return data


def _fits_beside(cupy: Any, nbytes: int) -> bool:
    """Whether ``nbytes`` of device arrays are a small enough share of the free memory to keep."""
    try:
        free = cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes()
    except Exception:  # a runtime that cannot say: keep nothing
        return False
    return bool(nbytes <= REFERENCE_SHARE * free)


def _first_launch(cupy: Any, launch: Callable[[], None], enter: Callable[[Phase], None],
                  clock: Callable[[], float], state: _State) -> float:
    """Launch once and wait for it (so a fault is classified as launch or run); when it began."""
    enter(Phase.LAUNCH)
    started = state.run_started = clock()
    launch()
    enter(Phase.RUN)
    cupy.cuda.runtime.deviceSynchronize()
    return started


def _execute_user(cupy: Any, trial: Trial, user: PreparedUser, state: _State,
                  enter: Callable[[Phase], None], started: float, clock: Callable[[], float]) -> TrialResult:
    build = user.candidate
    enter(Phase.COMPILE)
    _, kernel = _compile(cupy, build, state, clock)

    enter(Phase.ALLOCATE)
    specs = tuple(a for a in user.arguments if isinstance(a, ArraySpec))
    # Data read from a file is the user's: not kept (a spec's key leaves the data out).
    keep = not any(a.init == "data" for a in specs)
    data_key = ("user", specs)
    # A dict of this configuration's own: the check clears it, never the kept data.
    host = dict(_kept_data(data_key, lambda: initial_arrays(user.arguments)) if keep
                else initial_arrays(user.arguments))
    device = {name: cupy.asarray(data) for name, data in host.items()}
    args = launch_arguments(user.arguments, device, build.scalars)

    def launch() -> None:
        kernel(build.grid, build.block, args)

    run_started = _first_launch(cupy, launch, enter, clock, state)
    if user.reference is None:
        log("the configuration is the reference configuration: nothing to compare")
        enter(Phase.TIME)
        return _timed(cupy, trial, launch, state, started, run_started, clock)
    reference = user.reference
    # A user's kernel may update its outputs in place: what is checked is the first
    # launch's output, kept aside when the check may wait for the first timed launches.
    first = _first_outputs(cupy, device, user) if can_prune(trial.repeats, trial.prune_above_ms) else device

    reference_key = (data_key, reference.key, tuple(reference.grid), tuple(reference.block),
                     tuple(sorted((name, repr(value)) for name, value in reference.scalars.items())))

    def mismatch_in(expected: dict[str, Any]) -> str | None:
        return verification.outputs_mismatch(
            first, expected, [out.name for out in user.outputs], user.atol, user.rtol,
            check=lambda got, exp, atol, rtol: verification.mismatch(cupy, got, exp, atol, rtol,
                                                                     nan_is_unwritten=False))

    def fresh_reference() -> dict[str, Any]:
        enter(Phase.REFERENCE)
        expected = run_reference(cupy, reference, user.arguments, host)
        enter(Phase.VERIFY)
        return expected

    def verify() -> None:
        if keep and reference_key in _REFERENCE:
            enter(Phase.VERIFY)
        mismatch = _check_against_kept(cupy, reference_key, keep, mismatch_in, fresh_reference,
                                       lambda expected: sum(a.nbytes for a in expected.values()))
        if mismatch:
            raise WrongResult(mismatch)
        # Only the check needs the initial data and the copies: not the launches still to time.
        host.clear()
        if first is not device:
            first.clear()
        enter(Phase.TIME)

    if first is device:
        verify()  # nothing to prune, or no room on the GPU for a copy of the outputs: check now
        return _timed(cupy, trial, launch, state, started, run_started, clock)
    enter(Phase.TIME)
    return _timed(cupy, trial, launch, state, started, run_started, clock, verify=verify)


def _first_outputs(cupy: Any, device: dict[str, Any], user: PreparedUser) -> dict[str, Any]:
    """Copies of the output arrays, on the GPU; ``device`` itself when they do not fit.

    (A copy that fits can still leave too little for the reference's own arrays: then the
    reference fails, an infrastructure error, never a verdict on the configuration.)"""
    try:
        return {out.name: verification.device_copy(cupy, device[out.name]) for out in user.outputs}
    except cupy.cuda.memory.OutOfMemoryError:
        log("no GPU memory for a copy of the outputs: verifying before timing")
        return device


def launch_arguments(arguments: tuple[KernelArgument, ...], device: dict[str, Any],
                     scalars: dict[str, Any]) -> tuple[Any, ...]:
    """The kernel's parameters in declaration order: device arrays and by-value scalars."""
    return tuple(device[a.name] if isinstance(a, ArraySpec) else scalars[a.name] for a in arguments)


def run_reference(cupy: Any, reference: KernelBuild, arguments: tuple[KernelArgument, ...],
                  host: dict[str, np.ndarray]) -> dict[str, Any]:
    """The reference's output arrays, computed on fresh copies of the candidate's initial data.

    Any failure here is the reference's, not the candidate's: :class:`ReferenceFailed`.
    """
    step = Phase.COMPILE
    kernel = None
    try:
        _, kernel, _ = compile_kernel(cupy, reference)
        step = Phase.ALLOCATE
        device = {name: cupy.asarray(data) for name, data in host.items()}
        step = Phase.LAUNCH
        kernel(reference.grid, reference.block, launch_arguments(arguments, device, reference.scalars))
        step = Phase.RUN
        cupy.cuda.runtime.deviceSynchronize()
    except Exception as exc:
        _, text = classify(exc, step)
        if step in (Phase.LAUNCH, Phase.RUN):
            text += f" ({describe_launch(reference, kernel_resources(kernel))})"
        raise ReferenceFailed(f"reference configuration failed: {text}") from None
    return {a.name: device[a.name] for a in arguments if isinstance(a, ArraySpec) and a.output}


def _timed(cupy: Any, trial: Trial, launch: Callable[[], None], state: _State, started: float,
           run_started: float, clock: Callable[[], float], flops: float = 0.0,
           verify: Callable[[], None] | None = None) -> TrialResult:
    times = measure(
        launch,
        cuda_event_timer(cupy),
        warmups=trial.warmups,
        repeats=trial.repeats,
        min_duration_s=trial.min_duration_s,
        deadline=started + MEASURE_BUDGET * trial.timeout_s,
        clock=clock,
        prune_above_ms=trial.prune_above_ms,
        verify=verify,
    )
    stats = summarize(times)
    rate = f", {flops / stats.median / 1e6:.1f} GFLOP/s" if flops and stats.median > 0 else ""
    pruned = len(times) < trial.repeats  # `measure` runs every repeat asked for unless it prunes
    note = f" (pruned: over {trial.prune_above_ms:g} ms, output not verified)" if pruned else ""
    log(f"timed: {stats.line()}{rate}{note}")
    if not stats.median > 0:
        raise RuntimeError(f"CUDA events returned a non-positive median time {stats.median}")
    return TrialResult(
        outcome=Outcome.OK,
        objective=stats.median,
        times=reported(times),
        fingerprint=state.fingerprint,
        compile_s=state.compile_s,
        run_s=round(clock() - run_started, 3),
        pruned=pruned or None,
    )
