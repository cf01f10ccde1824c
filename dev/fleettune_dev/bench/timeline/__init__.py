"""`fleettune bench timeline`: wall-clock and GPU-seconds until a kernel is tuned.

A discrete-event replay of recorded Kernel Tuner caches, no cluster: the real `Study`
suggests (its latency measured with ``perf_counter`` and put on the simulated clock),
each configuration costs what the recording says it cost (compile, verification,
benchmark), on a pool of ``--gpus`` GPUs whose Pods start in a time drawn from a
log-normal model. Modes:

* ``pod``: one configuration per Pod (start-up + compile + verification + benchmark,
  the GPU held for the Pod's whole life), one Pod per GPU at a time, the study
  suggesting with the in-flight configurations pending;
* ``batch``: batched Pods with compile-ahead: one start-up per Pod, compiles
  on the node's CPU cores ahead of the GPU, the batch size from
  `fleettune.optimize.batching.batch_size`;
* ``kernel_tuner:<strategy>``: Kernel Tuner itself in its simulation mode on the same
  cache; its wall-clock is the recorded cost of what it evaluated, in its order, one
  configuration at a time on one GPU.

Per space, seed and mode: wall-clock and GPU-seconds to 0.95 and 0.99 of the recorded
optimum, GPU-busy fraction and evaluations. docs/benchmarks.md has the measurements and
the targets.
"""

# This docstring is the command's description (`cli.parse_args`, docs/reference/cli.md).
# The package, by concern: `model` (the fleet model, the recorded spaces, a run's result),
# `fleet` (the discrete-event simulator of the ``pod`` and ``batch`` modes), `kerneltuner`
# (the Kernel Tuner driver), `stats` (metrics, bounds, the comparison), `report` (tables and
# plots), `runner` (jobs, worker processes, traces) and `cli` (arguments and `main`).

from __future__ import annotations

from fleettune_dev.bench.kerneltuner import KernelTunerCache
from fleettune_dev.bench.timeline.cli import DEFAULT_MODES, DEFAULT_SPACES, default_caches, main, parse_args
from fleettune_dev.bench.timeline.fleet import (
    PodRun,
    observe_recorded,
    plan_pod,
    pod_answers,
    pruned_runs,
    simulate_fleet,
    startup_draws,
)
from fleettune_dev.bench.timeline.kerneltuner import run_kernel_tuner
from fleettune_dev.bench.timeline.model import (
    FLEET_MODES,
    KT_PREFIX,
    PRUNE_SLOWER_THAN,
    FleetModel,
    Run,
    TimedSpace,
    load_timed_space,
)
from fleettune_dev.bench.timeline.report import format_space_table, format_summary, save_plots
from fleettune_dev.bench.timeline.runner import Job, execute, run_all
from fleettune_dev.bench.timeline.stats import (
    GPU_S_PER_EVAL_FACTOR,
    LEVELS,
    WALL_RATIO_TARGET,
    clairvoyant_s,
    compare,
    curve,
    random_expectation_s,
    reach,
    run_metrics,
    summarise,
)

__all__ = [
    "DEFAULT_MODES", "DEFAULT_SPACES", "FLEET_MODES", "GPU_S_PER_EVAL_FACTOR", "KT_PREFIX", "LEVELS",
    "PRUNE_SLOWER_THAN", "WALL_RATIO_TARGET", "FleetModel", "Job", "KernelTunerCache", "PodRun", "Run",
    "TimedSpace", "clairvoyant_s", "compare", "curve", "default_caches", "execute", "format_space_table",
    "format_summary", "load_timed_space", "main", "observe_recorded", "parse_args", "plan_pod", "pod_answers",
    "pruned_runs", "random_expectation_s", "reach", "run_all", "run_kernel_tuner", "run_metrics", "save_plots",
    "simulate_fleet", "startup_draws", "summarise",
]
