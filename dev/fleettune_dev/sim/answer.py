"""Turn a trial and a measurement into the result a real job would have written (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fleettune.fingerprint import (
    FT_DRIVER,
    FT_PRODUCT,
    GFD_CC_MAJOR,
    GFD_CC_MINOR,
    GFD_DRIVER,
    GFD_MEMORY,
    GFD_PRODUCT,
    GFD_RUNTIME,
)
from fleettune_dev.cluster.fleet import NodePool, label_value
from fleettune_dev.sim.recordings import KernelModel, Measurement, scale_ms
from fleettune_job.kernels import BUILTINS
from fleettune_job.protocol import PRUNE_RUNS, Fingerprint, Outcome, Trial, TrialResult
from fleettune_job.timing import pruned_after

# Time to compile one configuration (NVRTC + module load); Kernel Tuner's recordings of
# the convolution kernel show 0.8-0.9 s per configuration.
DEFAULT_COMPILE_S = 0.85

# Kernel Tuner's failure strings → the job's outcomes. A RuntimeFailedConfig is, in these
# recordings, a launch that the driver refused (too many registers/threads for the block):
# the job reports that as launch_error. An InvalidConfig never reaches the compiler; the
# job's nearest verdict is compile_error.
FAILURE_OUTCOMES = {
    "compile": Outcome.COMPILE_ERROR,
    "runtime": Outcome.LAUNCH_ERROR,
    "invalid": Outcome.COMPILE_ERROR,
}
_FAILURE_TEXT = {
    "compile": "CompilationFailedConfig",
    "runtime": "RuntimeFailedConfig",
    "invalid": "InvalidConfig",
}


# A launch the driver refuses costs about this much GPU time when the recording has no figure.
LAUNCH_FAILURE_S = 0.05


@dataclass(frozen=True)
class Answer:
    """One configuration's result and what it cost on the node (seconds, before time scaling).

    ``compile_s`` is host time before the GPU (compile and module load; for an infrastructure
    failure, the time to notice it), ``gpu_s`` the GPU's: the checked launch and the timed
    ones, 0 when the configuration never reached the GPU. A batch Pod overlaps the compiles
    of later configurations with the GPU work of earlier ones (`fleettune_dev.sim.batch`).
    """

    result: TrialResult
    compile_s: float
    gpu_s: float = 0.0

    @property
    def duration_s(self) -> float:
        """How long this configuration takes when nothing overlaps it (a batch of one, start-up aside)."""
        return self.compile_s + self.gpu_s


def fingerprint(pool: NodePool, labels: dict[str, str], *, synthetic: bool, verified: bool = False) -> Fingerprint:
    """What the job would report about its GPU, read from the node's labels where present.
    Unverified unless ``verified``: the simulator computes no outputs to check.

    Labels are what a driver upgrade changes, so they win over the fleet file. The product
    is the device name as the driver reports it (spaces, not GFD's dashes) when the label
    still names the pool's GPU.
    """
    g = pool.gpu
    product_label = labels.get(GFD_PRODUCT) or labels.get(FT_PRODUCT)
    product = g.product if product_label in (None, label_value(g.product)) else str(product_label)
    major = labels.get(GFD_CC_MAJOR, g.compute_major)
    minor = labels.get(GFD_CC_MINOR, g.compute_minor)
    driver = labels.get(GFD_DRIVER) or labels.get(FT_DRIVER) or g.driver_version
    runtime = labels.get(GFD_RUNTIME) or g.cuda_runtime_version
    memory = labels.get(GFD_MEMORY)
    return Fingerprint(
        product=product,
        compute_capability=f"{major}.{minor}",
        memory_mib=int(memory) if memory and memory.isdigit() else g.memory_mib,
        driver_version=driver,
        cuda_runtime_version=runtime,
        simulated=True,
        synthetic=synthetic,
        unverified=not verified,
    )


def recorder_verified(m: Measurement) -> bool:
    """Whether the tuner that recorded ``m`` checked its outputs: Kernel Tuner times the check
    as ``verification_time``, and writes 0 when it was given nothing to check against. The
    shipped recordings keep no such time, so their configurations count as unverified;
    user source is never run at all."""
    return m.verification_ms is not None and m.verification_ms > 0


def _scale_to_problem(m: Measurement, trial: Trial, recorded: list[int]) -> Measurement:
    """Times scale with the number of elements when the trial's problem differs (synthetic)."""
    if m.time_ms is None or list(trial.problem_size) == list(recorded) or not trial.problem_size:
        return m
    ratio = math.prod(trial.problem_size) / max(1, math.prod(recorded))
    return replace(m, time_ms=m.time_ms * ratio, times=tuple(t * ratio for t in m.times), synthetic=True,
                   verification_ms=scale_ms(m.verification_ms, ratio), benchmark_ms=scale_ms(m.benchmark_ms, ratio),
                   detail=f"{m.detail or 'recorded'}; scaled from problem size {recorded} to {trial.problem_size}")


def infra(error: str, pool: NodePool | None = None, labels: dict[str, str] | None = None) -> Answer:
    fp = fingerprint(pool, labels or {}, synthetic=False) if pool else Fingerprint(simulated=True, unverified=True)
    return Answer(TrialResult(outcome=Outcome.INFRA_ERROR, error=f"simulator: {error}"[:1000],
                              fingerprint=fp), compile_s=0.2)


def job_config(trial: Trial) -> dict[str, Any]:
    """The configuration as the job image runs it: a built-in kernel's defaults for the
    parameters the run does not tune (`KernelDescriptor.resolve`, as `fleettune_job.prepare`)."""
    kernel = BUILTINS.get(trial.kernel.builtin or "")
    if kernel is None or trial.kernel.source_path:
        return dict(trial.config)
    try:
        return kernel.resolve(trial.config)
    except ValueError:  # an unknown parameter: the job refuses it, and no recording has it either
        return dict(trial.config)


def answer_trial(trial: Trial, pool: NodePool, labels: dict[str, str], model: KernelModel,
                 *, compile_s: float = DEFAULT_COMPILE_S) -> Answer:
    m = _scale_to_problem(model.measure(job_config(trial)), trial, model.recording.problem_size)
    return answer_measurement(trial, pool, labels, m, compile_s=compile_s)


def invalid_configuration(outcome: Outcome, error: str, pool: NodePool, labels: dict[str, str], *,
                          compile_s: float = DEFAULT_COMPILE_S) -> Answer:
    """A verdict of real rules (NVRTC's, CUDA's launch limits) about user source: not synthetic."""
    assert outcome.is_invalid_configuration
    return _failed(outcome, error, fingerprint(pool, labels, synthetic=False), compile_s)


def _failed(outcome: Outcome, error: str, fp: Fingerprint, compile_s: float, gpu_s: float | None = None) -> Answer:
    # A launch failure happens on the GPU after compiling; the others instead of running.
    gpu = (gpu_s or LAUNCH_FAILURE_S) if outcome == Outcome.LAUNCH_ERROR else 0.0
    return Answer(TrialResult(outcome=outcome, error=error[:1000], fingerprint=fp, compile_s=round(compile_s, 3)),
                  compile_s=compile_s, gpu_s=gpu)


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def scaled_runs(time_ms: float, runs: Sequence[float]) -> list[float]:
    """A recorded configuration's runs on the scale of its recorded time: what the job's
    timing loop sees of a configuration whose objective is that time. Some recordings' time
    is not their runs' median (the RTX 2080 Ti convolution's is up to 30 % off), and every
    configuration's objective, and the pruning decision on it, must stay on the recording's
    own scale."""
    middle = statistics.median(runs)
    return [r * time_ms / middle for r in runs]


def pruned_result(time_ms: float, runs: Sequence[float]) -> tuple[float, list[float]]:
    """What the job reports of a recorded configuration it pruned: the median of its first
    PRUNE_RUNS runs on the recording's scale (`scaled_runs`), and those runs. Above the
    cut-off whenever `pruned_after` prunes on them, as in the job."""
    first = scaled_runs(time_ms, runs)[:PRUNE_RUNS]
    return statistics.median(first), first


def answer_measurement(trial: Trial, pool: NodePool, labels: dict[str, str], m: Measurement,
                       *, compile_s: float = DEFAULT_COMPILE_S) -> Answer:
    """The job's result for measurement ``m``. Costs are the recording's own when it has
    them, else modelled: ``compile_s`` to compile, the kernel time × (warm-ups + repeats)
    on the GPU (no separate verification). Its outputs are unverified unless the recording
    says they were checked (`recorder_verified`)."""
    fp = fingerprint(pool, labels, synthetic=m.synthetic, verified=recorder_verified(m))
    recorded_compile = _seconds(m.compile_ms)
    compile_s = compile_s if recorded_compile is None else recorded_compile
    verification_s = _seconds(m.verification_ms) or 0.0
    if m.failure is not None:
        outcome = FAILURE_OUTCOMES[m.failure]
        text = f"{_FAILURE_TEXT[m.failure]} ({m.detail})" if m.detail else _FAILURE_TEXT[m.failure]
        return _failed(outcome, f"simulated: {text}", fp, compile_s,
                       gpu_s=verification_s + (_seconds(m.benchmark_ms) or 0.0))
    assert m.time_ms is not None
    recorded_benchmark = _seconds(m.benchmark_ms)
    objective, runs = m.time_ms, m.times or (m.time_ms,)
    cut = pruned_after(scaled_runs(m.time_ms, runs), min(trial.repeats, len(runs)), trial.prune_above_ms)
    if cut:
        # The job stops timing after PRUNE_RUNS launches, before verifying: their share of
        # the recorded benchmark, no verification.
        objective, runs = pruned_result(m.time_ms, runs)
        run_s = (m.time_ms * (trial.warmups + PRUNE_RUNS) / 1000.0 if recorded_benchmark is None
                 else recorded_benchmark * PRUNE_RUNS / len(m.times))
    else:
        timing_s = (m.time_ms * (trial.warmups + trial.repeats) / 1000.0 if recorded_benchmark is None
                    else recorded_benchmark)
        run_s = verification_s + max(timing_s, trial.min_duration_s)
    if compile_s + run_s > trial.timeout_s:
        # The job's watchdog ends the configuration at its timeout, on the GPU or before it.
        cpu = min(compile_s, trial.timeout_s)
        return Answer(TrialResult(outcome=Outcome.TIMEOUT, fingerprint=fp,
                                  error=f"simulated: exceeded the trial timeout of {trial.timeout_s:g}s"),
                      compile_s=cpu, gpu_s=trial.timeout_s - cpu)
    times = [round(t, 6) for t in runs[:trial.repeats]]
    result = TrialResult(outcome=Outcome.OK, objective=round(objective, 6), times=times, fingerprint=fp,
                         compile_s=round(compile_s, 3), run_s=round(run_s, 4), pruned=cut or None)
    return Answer(result, compile_s=compile_s, gpu_s=run_s)
