"""A synthetic model of a built-in kernel on a pool that has no recording of it.

Recordings exist for few (kernel, GPU) pairs; every other built-in kernel on every pool is
answered by one rule, so that any run of a built-in tunes in any fleet. The model is a
stand-in, never a measurement: every answer is marked synthetic (``[synthetic]`` in the
outputs, ``fingerprint.synthetic`` in the status), as for a pool's ``synthetic`` model.

What it answers follows the job (`fleettune_job.prepare`) and the GPU, in their order:

1. the job's own preparation of the trial: an unusable trial (bad problem size) is an
   infrastructure error; an unknown parameter or a broken enforced constraint of the
   kernel (vector widths, tiles that must divide the problem) a compile error; a launch
   geometry that cannot be evaluated a launch error — the job's words, as the job says them;
2. CUDA's launch limits of the pool's GPU (`fleettune.space.devices`): threads per block,
   block and grid dimensions: a launch error;
3. the kernel's other constraints, the hardware limits it declares (static shared memory):
   a compile error, as ptxas would refuse the configuration;
4. a time: the kernel's work over a rough roofline of the GPU (its SM count), × a smooth
   bowl per parameter, × a few percent of noise per configuration. A bowl's optimum and
   steepness are fixed per (seed, kernel, parameter), the optimum shifted a little per GPU
   model, so pools disagree on the best configuration as real GPUs do. The same seed gives
   the same answer in every process.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from fleettune.space.devices import DeviceLimits, lookup_device
from fleettune.space.errors import SpaceError
from fleettune_dev.cluster.fleet import NodePool
from fleettune_dev.sim.answer import DEFAULT_COMPILE_S, Answer, answer_measurement, fingerprint, infra
from fleettune_dev.sim.recordings import Measurement, noise_factor, unit_hash
from fleettune_job.classify import JobError
from fleettune_job.expressions import ExpressionError
from fleettune_job.kernels import BUILTINS, KernelDescriptor
from fleettune_job.prepare import Prepared, prepare
from fleettune_job.protocol import Outcome, Trial

MODEL_NOISE = 0.03  # relative spread of a configuration's time around its landscape value
MAX_REPEATS = 8
LAUNCH_MS = 0.005  # a launch's fixed cost
# A rough roofline per SM at the landscape's optimum (fp32 FMA throughput and DRAM bandwidth
# divided by the SM count: ~1.1e8 flop/ms and ~1.3e7 B/ms on an A100, an RTX A4000, an Orin).
FLOP_PER_MS_PER_SM = 1.1e8
BYTES_PER_MS_PER_SM = 1.3e7
STEEPNESS = (0.1, 1.0)  # a parameter's bowl: at most 1 + this much slower at the far end of its range
DEVICE_SHIFT = 0.25  # how far (in a parameter's normalised range) a GPU model moves the optimum
LABEL = "synthetic: built-in kernel model (no recording for this pool)"


def modelled_kernels(pool: NodePool) -> list[str]:
    """The built-in kernels ``pool`` answers from this model: those its fleet file gives
    neither a recording nor a synthetic model."""
    return sorted(set(BUILTINS) - set(pool.simulation.kernels()))


def device_limits(product: str, compute_capability: str) -> DeviceLimits:
    """The GPU's limits from the device table; an unknown GPU gets CUDA's common limits."""
    try:
        return lookup_device(product, compute_capability)
    except SpaceError:
        major, minor = (int(p) for p in compute_capability.split("."))
        return DeviceLimits(name=product, compute_capability_major=major, compute_capability_minor=minor,
                            multiprocessor_count=16, l2_cache_size=0, global_memory=0)


def launch_refused(device: DeviceLimits, grid: Sequence[int], block: Sequence[int]) -> str | None:
    """Why the GPU refuses to launch ``grid`` × ``block``, in the driver's words; None: it launches."""
    threads = math.prod(block)
    limits = (("block", block, (device.max_block_dim_x, device.max_block_dim_y, device.max_block_dim_z)),
              ("grid", grid, (device.max_grid_dim_x, device.max_grid_dim_y, device.max_grid_dim_z)))
    if min(*grid, *block) < 1:
        return f"CUDA_ERROR_INVALID_VALUE: grid {list(grid)}, block {list(block)} (a dimension below 1)"
    if threads > device.max_threads_per_block:
        return (f"CUDA_ERROR_INVALID_VALUE: block {list(block)} has {threads} threads "
                f"(at most {device.max_threads_per_block} on {device.name})")
    for what, dims, most in limits:
        for axis, n, top in zip("xyz", dims, most, strict=True):
            if n > top:
                return f"CUDA_ERROR_INVALID_VALUE: {what} {list(dims)}: {axis} above {top} on {device.name}"
    return None


def _position(value: int, values: Sequence[int]) -> float:
    """Where ``value`` lies in a parameter's declared range, 0..1 on a log scale (a value
    outside the range lies beyond it: the bowl extends)."""
    low, high = math.log2(1 + min(values)), math.log2(1 + max(values))
    if high == low:
        return 0.5
    return (math.log2(1 + max(0, value)) - low) / (high - low)


def kernel_time_ms(prepared: Prepared, device: DeviceLimits, seed: int) -> float:
    """The landscape's time for a prepared configuration on ``device`` (before noise)."""
    desc, config, size = prepared.descriptor, prepared.config, prepared.problem_size
    problem = desc.problem
    elements = [math.prod(t.shape) for t in problem.inputs(size, config)] + [math.prod(problem.output(size).shape)]
    flop_ms = problem.flops(size, config) / FLOP_PER_MS_PER_SM
    byte_ms = 4.0 * sum(elements) / BYTES_PER_MS_PER_SM
    time_ms = LAUNCH_MS + max(flop_ms, byte_ms) / max(1, device.multiprocessor_count)
    for p in desc.parameters:
        if len(p.values) < 2:
            continue
        optimum = unit_hash(seed, desc.name, p.name, "optimum")
        optimum += DEVICE_SHIFT * (unit_hash(seed, desc.name, p.name, "device", device.name) - 0.5)
        low, high = STEEPNESS
        steepness = low + (high - low) * unit_hash(seed, desc.name, p.name, "steepness")
        time_ms *= 1 + steepness * (_position(config[p.name], p.values) - optimum) ** 2
    return time_ms


def builtin_measurement(prepared: Prepared, device: DeviceLimits, repeats: int, seed: int) -> Measurement:
    """The model's verdict on a configuration the job prepared: a hardware limit it breaks,
    or its time with ``repeats`` noisy runs."""
    desc, config, size = prepared.descriptor, prepared.config, prepared.problem_size
    refused = launch_refused(device, prepared.grid, prepared.block)
    if refused is not None:
        return Measurement(time_ms=None, failure="runtime", synthetic=True, detail=f"{LABEL}: {refused}")
    for c in desc.constraints:
        if c.enforced:  # the job checked these before
            continue
        try:
            holds = c.holds(config, size)
        except ExpressionError:
            holds = False
        if not holds:
            return Measurement(time_ms=None, failure="compile", synthetic=True,
                               detail=f"{LABEL}: breaks {c.expr} ({c.doc})")
    key = json.dumps(config, sort_keys=True, separators=(",", ":"))
    time_ms = kernel_time_ms(prepared, device, seed) * noise_factor(MODEL_NOISE, seed, desc.name, device.name, key)
    times = tuple(time_ms * noise_factor(MODEL_NOISE / 5, seed, desc.name, device.name, key, size, i)
                  for i in range(max(1, min(repeats, MAX_REPEATS))))
    return Measurement(time_ms=time_ms, times=times, synthetic=True, detail=LABEL)


def answer_builtin(trial: Trial, pool: NodePool, labels: dict[str, str], desc: KernelDescriptor, *,
                   seed: int = 0, compile_s: float = DEFAULT_COMPILE_S) -> Answer:
    """The job's result for ``trial`` of built-in ``desc`` on ``pool``, from the model."""
    device_fp = fingerprint(pool, labels, synthetic=True)
    try:
        prepared = prepare(trial)
    except JobError as exc:
        if exc.outcome == Outcome.INFRA_ERROR:
            return infra(str(exc), pool, labels)
        m = Measurement(time_ms=None, failure="runtime" if exc.outcome == Outcome.LAUNCH_ERROR else "compile",
                        synthetic=True, detail=f"{LABEL}: {exc}")
        # The job refuses before compiling: no compile time.
        return answer_measurement(trial, pool, labels, m, compile_s=0.0 if m.failure == "compile" else compile_s)
    assert isinstance(prepared, Prepared) and prepared.descriptor is desc
    device = device_limits(device_fp.product, device_fp.compute_capability)
    return answer_measurement(trial, pool, labels, builtin_measurement(prepared, device, trial.repeats, seed),
                              compile_s=compile_s)
