"""Compile-ahead: a batch's kernels compiled on the node's CPU cores while the GPU works.

NVRTC needs no GPU, so the batch supervisor compiles the configurations of a batch in a
pool of processes (never the CUDA worker, and never a process with a CUDA context), for
the device's real architecture, into one cubin per build. The CUDA worker then loads the
cubin instead of compiling, and the GPU's critical path is verification and timing.

The cubin is the module the worker would build itself: the same NVRTC, the same code (the
configuration's defines written into the source) and options (the CUDA headers, plus what
cupy's ``RawModule`` adds), the device's exact architecture. Compile-ahead is an
optimisation, never a source of verdicts the GPU path would not give: a configuration is
answered without the GPU only when its source does not compile (``compile_error``) or its
compiled resources certainly exceed the device (``launch_error``, see
:mod:`fleettune_job.resources`). Anything else that goes wrong here (no libnvrtc, an
architecture this NVRTC does not know, a missing include, a crash, a compile slower than
the configuration's timeout) only means no cubin: the worker compiles as it always has,
under the watchdog.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path

from fleettune_job import nvrtc
from fleettune_job.classify import TrialSpecError, compiler_summary, short
from fleettune_job.prepare import KernelBuild, Prepared, PreparedUser, prepare
from fleettune_job.protocol import Outcome, Trial, TrialResult
from fleettune_job.resources import Launch, describe_launch, over_limits, ptxas_resources

COMPILE_WORKERS_ENV = "FLEETTUNE_COMPILE_WORKERS"
MAX_COMPILE_WORKERS = 4
# ptxas's report of registers and shared memory per kernel, in NVRTC's log.
PTXAS_VERBOSE = "-Xptxas=-v"


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The container's CPU limit (cgroup v2 ``cpu.max``, or v1 CFS quota), None when unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    limit = cgroup_cpus(cgroup_root)
    if limit is not None:
        cpus = min(cpus, math.ceil(limit))
    return max(1, cpus)


def compile_workers(environ: Mapping[str, str], cpus: int | None = None) -> int:
    """Pool size: ``FLEETTUNE_COMPILE_WORKERS`` (0 turns compile-ahead off), else one process per
    available CPU but one — the GPU worker's host thread launches the timed kernels, and a
    starved launch thread shows up as idle GPU time between the timing events — at least 1,
    at most 4."""
    raw = environ.get(COMPILE_WORKERS_ENV, "").strip()
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            print(f"fleettune-job: ignoring {COMPILE_WORKERS_ENV}={raw!r} (not an integer)", file=sys.stderr)
    cpus = available_cpus() if cpus is None else cpus
    return max(1, min(cpus - 1, MAX_COMPILE_WORKERS))


def _lower_priority() -> None:
    # The compiles share the CPUs with the GPU worker, whose launches must not wait.
    with contextlib.suppress(OSError):
        os.nice(10)


def make_executor(workers: int) -> Executor:
    # spawn, not fork: a pool process starts from a clean interpreter, whatever its parent holds.
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_lower_priority)


def stop_executor(executor: Executor) -> None:
    executor.shutdown(wait=False, cancel_futures=True)
    if isinstance(executor, ProcessPoolExecutor):
        # A compile still running is of no use any more; exiting would wait for it.
        for child in multiprocessing.active_children():
            child.kill()


@dataclass(frozen=True)
class Build:
    """One compile: what the pool process needs (picklable)."""

    key: str
    source: str  # the code: defines written in (Prepared.code)
    options: tuple[str, ...]
    function: str

    @classmethod
    def of(cls, build: Prepared | KernelBuild) -> Build:
        return cls(build.key, build.code, build.options, build.function)


@dataclass(frozen=True)
class Artefact:
    """What compiling one build gave: a cubin, or the source's compile error, or neither (``note``)."""

    path: str = ""
    seconds: float = 0.0
    error: str = ""  # the compile_error text (the source does not compile)
    resources: dict[str, int] = field(default_factory=dict)
    note: str = ""  # why there is neither


Compiler = Callable[[Build, str, str], Artefact]


def compile_build(build: Build, compute_capability: str, out_dir: str) -> Artefact:
    """Compile ``build`` for the device into ``out_dir/<key>.cubin`` (runs in a pool process)."""
    started = time.monotonic()
    try:
        options = [*nvrtc.job_options(build.options), nvrtc.arch_option(compute_capability)]
        compiled = nvrtc.compile_source(build.source, [*options, PTXAS_VERBOSE], cubin=True)
        if not compiled.ok:
            # Verbose ptxas output replaces ptxas's error lines in NVRTC's log (CUDA 12.9), and an
            # NVRTC without --ptxas-options refuses the option: the plain compile's log is the
            # one the worker would see (and its cubin, unchecked, still helps).
            compiled = nvrtc.compile_source(build.source, options, cubin=True)
    except (RuntimeError, ValueError, OSError) as exc:
        return Artefact(note=f"not compiled ahead: {exc}")
    seconds = round(time.monotonic() - started, 3)
    if compiled.ok and compiled.cubin:
        path = Path(out_dir, f"{build.key}.cubin")
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(compiled.cubin)
            os.replace(tmp, path)  # the worker never loads half a file
        except OSError as exc:
            return Artefact(seconds=seconds, note=f"cannot write {path}: {exc}")
        return Artefact(path=str(path), seconds=seconds, resources=ptxas_resources(compiled.log, build.function))
    log = compiled.log
    # An include NVRTC cannot find here: the worker, with cupy's include paths, is the judge.
    if compiled.source_error and not compiled.missing_include:
        return Artefact(seconds=seconds, error=short(f"compile error: {compiler_summary(log)}"))
    return Artefact(seconds=seconds, note=f"not compiled ahead (NVRTC status {compiled.status}): {short(log, 200)}")


@dataclass(frozen=True)
class AheadOptions:
    """How compile-ahead runs: the pool's size, the compile function and the pool."""

    workers: int
    compiler: Compiler = compile_build
    executor: Callable[[int], Executor] = make_executor

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> AheadOptions | None:
        workers = compile_workers(environ)
        if workers < 1:
            return None
        if not nvrtc.available():
            _log("off: libnvrtc not found (the worker compiles each configuration)")
            return None
        return cls(workers)


@dataclass(frozen=True)
class Verdict:
    """What compile-ahead says about one configuration: its answer (without the GPU), or
    the cubins the worker should load (build key -> path, compile seconds), or nothing."""

    result: TrialResult | None = None
    cubins: dict[str, tuple[str, float]] = field(default_factory=dict)


def _prepare_all(trials: Iterable[Trial]) -> list[tuple[Trial, Prepared | PreparedUser]]:
    """The trials prepared as the worker prepares them, those that can be. A trial that cannot
    is left to the worker, which gives the one verdict; a failure of the batch rather than
    of a configuration (unreadable source or data, a failing reference) leaves all of them
    to it, so that no configuration is answered where the worker would fail the trial."""
    prepared: list[tuple[Trial, Prepared | PreparedUser]] = []
    for position, trial in enumerate(trials):
        try:
            # Data files are the batch's, not a configuration's: read once, with the first.
            prepared.append((trial, prepare(trial if position == 0 else _without_data_files(trial))))
        except TrialSpecError:
            return []
        except Exception:
            continue
    return prepared


def _without_data_files(trial: Trial) -> Trial:
    """``trial`` with zeros where arrays would be read from data files: their content
    changes nothing the compile depends on (source, defines, geometry, scalars)."""
    arguments = trial.kernel.arguments
    if not arguments or all(a.init != "data" for a in arguments):
        return trial
    zeros = [a.model_copy(update={"init": "zeros", "data_path": None}) if a.init == "data" else a for a in arguments]
    return trial.model_copy(update={"kernel": trial.kernel.model_copy(update={"arguments": zeros})})


@dataclass(frozen=True)
class _Plan:
    candidate: str  # build key
    launch: Launch
    reference: str | None


def _log(message: str) -> None:
    print(f"fleettune-job: compile-ahead: {message}", file=sys.stderr, flush=True)


class CompileAhead:
    """Compiles every build of ``trials`` in ``executor``, a user kernel's reference once,
    in the order the worker needs them."""

    def __init__(self, trials: Iterable[Trial], *, compute_capability: str, limits: Mapping[str, int],
                 out_dir: Path, executor: Executor, compiler: Compiler = compile_build) -> None:
        self._limits = dict(limits)
        self._plans: dict[int, _Plan] = {}
        self._futures: dict[str, Future[Artefact]] = {}
        builds: list[Prepared | KernelBuild] = []
        references: list[KernelBuild] = []
        for trial, prepared in _prepare_all(trials):
            candidate = prepared.candidate if isinstance(prepared, PreparedUser) else prepared
            reference = prepared.reference if isinstance(prepared, PreparedUser) else None
            self._plans[trial.index] = _Plan(candidate.key, candidate, reference.key if reference else None)
            builds.append(candidate)
            if reference is not None:
                references.append(reference)
        # References first: every configuration of a user kernel needs its cubin.
        for build in [*references, *builds]:
            if build.key not in self._futures:
                self._futures[build.key] = executor.submit(compiler, Build.of(build), compute_capability,
                                                           str(out_dir))

    def verdict(self, trial: Trial, timeout: float) -> Verdict:
        """Waits at most ``timeout`` for the configuration's compile."""
        plan = self._plans.get(trial.index)
        if plan is None:
            return Verdict()
        artefact = self._artefact(plan.candidate, timeout)
        if artefact is None or artefact.note:
            if artefact is not None:
                _log(f"#{trial.index}: {artefact.note}")
            return Verdict()
        if artefact.error:
            return Verdict(TrialResult(outcome=Outcome.COMPILE_ERROR, error=artefact.error, compile_s=artefact.seconds))
        reason = over_limits(plan.launch, artefact.resources, self._limits)
        if reason is not None:
            launch = describe_launch(plan.launch, artefact.resources)
            text = f"launch error (found before launching): {reason} ({launch})"
            return Verdict(TrialResult(outcome=Outcome.LAUNCH_ERROR, error=short(text), compile_s=artefact.seconds))
        cubins = {plan.candidate: (artefact.path, artefact.seconds)}
        # The reference is only loaded if it is ready: the worker compiles it once otherwise.
        reference = self._artefact(plan.reference, 0.0) if plan.reference else None
        if reference is not None and reference.path and plan.reference:
            cubins[plan.reference] = (reference.path, reference.seconds)
        return Verdict(cubins=cubins)

    def _artefact(self, key: str, timeout: float) -> Artefact | None:
        future = self._futures[key]
        wait_futures([future], timeout=timeout)
        if not future.done() or future.cancelled():
            if timeout > 0:
                _log(f"compile of {key} not done within {timeout:g} s: the worker compiles it")
            return None
        if future.exception() is not None:  # a pool process died (NVRTC crashed), or the pool broke
            _log(f"compile of {key} failed: {future.exception()!r}")
            return None
        return future.result()
