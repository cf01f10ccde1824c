"""Run one trial (a configuration of a batch) on the GPU: find the device, compile, launch, verify, time.

Phases run in a fixed order and every exception is classified by the phase it escaped
from (see :mod:`fleettune_job.classify`). The device and the compiled kernels are
:mod:`fleettune_job.gpu`'s (cupy is imported there lazily, so that the package imports on
machines without CUDA); the problem's data and reference, kept across the configurations
of a batch, :mod:`fleettune_job.kept`'s; the verification kernels compiled in the set-up
phase, :mod:`fleettune_job.warmup`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleettune_job import gpu, kept, verification, warmup
from fleettune_job.arguments import ArraySpec, KernelArgument, initial_arrays
from fleettune_job.classify import Phase, ReferenceFailed, WrongResult, classify, short
from fleettune_job.gpu import log
from fleettune_job.prepare import KernelBuild, Prepared, PreparedUser, prepare
from fleettune_job.protocol import Fingerprint, Outcome, Trial, TrialResult
from fleettune_job.resources import describe_launch
from fleettune_job.timing import can_prune, cuda_event_timer, measure, reported, summarize

# Share of the timeout after which extra repeats for min_duration_s stop.
MEASURE_BUDGET = 0.8

Progress = Callable[[Phase, Fingerprint], None]


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
        cupy = gpu.load_cupy()
        state.fingerprint = fingerprint or gpu.describe_device(cupy)
        enter(Phase.SETUP)
        prepared = prepare(trial)
        log(f"trial {trial.run}/{trial.target}#{trial.index}: {prepared.label} {prepared.config} "
            f"problem {list(prepared.problem_size)}")
        warmup.warm_verification(cupy, prepared)
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


_ORIGIN_NOTE = {"cache": " (in-process cache)", "cubin": " (compiled ahead)", "nvrtc": ""}


def _compile(cupy: Any, build: Prepared | KernelBuild, state: _State, clock: Callable[[], float]) -> tuple[Any, Any]:
    t0 = clock()
    module, kernel, origin = gpu.compile_kernel(cupy, build)
    # Compiled ahead: the compile took its seconds on the CPU, off the GPU's path.
    ahead = gpu.compiled_ahead_s(build.key) if origin == "cubin" else 0.0
    state.compile_s = round(clock() - t0 + ahead, 3)
    resources = gpu.kernel_resources(kernel)
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
    host = kept.data(data_key, lambda: kept.draw(problem, tensors))
    inputs = {name: cupy.array(array) for name, array in host.items()}
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
        mismatch = kept.check(
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
    host = dict(kept.data(data_key, lambda: initial_arrays(user.arguments)) if keep
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
        if keep and kept.has_reference(reference_key):
            enter(Phase.VERIFY)
        mismatch = kept.check(cupy, reference_key, keep, mismatch_in, fresh_reference,
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
        _, kernel, _ = gpu.compile_kernel(cupy, reference)
        step = Phase.ALLOCATE
        device = {name: cupy.asarray(data) for name, data in host.items()}
        step = Phase.LAUNCH
        kernel(reference.grid, reference.block, launch_arguments(arguments, device, reference.scalars))
        step = Phase.RUN
        cupy.cuda.runtime.deviceSynchronize()
    except Exception as exc:
        _, text = classify(exc, step)
        if step in (Phase.LAUNCH, Phase.RUN):
            text += f" ({describe_launch(reference, gpu.kernel_resources(kernel))})"
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
