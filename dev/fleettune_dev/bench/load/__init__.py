"""`fleettune bench load`: the operator under a simulated fleet's load, and a report.

Builds a local control plane with a fleet of N GPUs in P pools (KWOK nodes), starts the
fleet simulator and the operator (a subprocess, measured from /proc), applies R
TuningRuns (the convolution example on every pool, random strategy by default) whose
budgets add up to T trials, K configurations per trial Pod (``--trials-per-pod``, 1 by
default), waits for them to finish and prints:

* trials per minute; fleet utilisation (GPU-seconds holding a trial Pod between its
  start and end / GPUs × wall time), overall and in the steady state (10 %-90 % of
  trials), and why the steady state's idle GPUs were idle: a Pod bound to them not yet
  Running (kwok), a Pod of their pool waiting for a node (the scheduler), or no Pod at
  all (the operator and the Job controller);
* p50/p99 reaction latency: from a trial Pod finishing (seen on a watch) to the next Job
  the operator creates for the same run and pool (FIFO matching, the opening burst of
  each run excluded);
* operator CPU seconds and peak RSS (VmHWM), and the CPU of this process (simulator and
  observers, which share the machine with the control plane); the machine's CPU (busy
  share, time saturated, each control-plane component's seconds) and the reactions split
  by whether the machine was saturated while they took place; API requests per second and per
  evaluation (the apiserver's ``apiserver_request_total`` delta, every client included, over
  the configurations recorded) and the busiest verbs;
* GPU utilisation: the evaluations' GPU time (what each trial Pod reports as run time) over
  the GPU time the trial Pods held (bound to their end);
* the largest TuningRun object (JSON bytes, sampled during and after the run);
* an audit: the results store against the simulator's answers (no loss, no duplicate
  (target, index), each pool exactly at its budget).

Each figure is marked against its target (`TARGETS`; docs/benchmarks.md has what was
measured). Defaults are the full benchmark (300 GPUs, 3 pools, 20
runs, 10 000 trials); for a quick run: ``fleettune bench load --gpus 24 --runs 4 --trials
240 --trial-seconds 4``. ``--pod-startup`` has the simulator model each Pod's start-up
(p50 ≈ 2 s, p99 ≈ 5 s), the cost batching amortises.
"""

# This docstring is the command's description (`cli.main`, docs/reference/cli.md).
# The package, by concern: `workload` (the fleet and the runs applied), `observe` (watching
# trial Pods and Jobs, /proc and the apiserver's metrics), `analysis` (latencies,
# utilisation, the audit: pure), `report` (the figures against their targets),
# `benchmark` (the cluster, the simulator and the operator, run and measured) and `cli`.

from __future__ import annotations

from fleettune_dev.bench.load.analysis import (
    IDLE_CAUSES,
    SATURATED,
    CpuSampler,
    Reaction,
    audit,
    cpu_jiffies,
    gpu_utilisation,
    idle_breakdown,
    job_controller_delays,
    pod_waits,
    quantile,
    quantiles,
    reaction_latencies,
    reactions_by_load,
    steady_window,
    utilisation,
)
from fleettune_dev.bench.load.benchmark import run_benchmark, start_profiler, summarise_profile
from fleettune_dev.bench.load.cli import main, trials_per_pod
from fleettune_dev.bench.load.observe import (
    Observer,
    PodTimes,
    apiserver_requests,
    gpu_busy_seconds,
    job_trials,
    proc_cpu_seconds,
    proc_peak_rss,
    revision,
    termination_message,
)
from fleettune_dev.bench.load.report import TARGETS, Report
from fleettune_dev.bench.load.workload import EXAMPLE, MANAGED, NAMESPACE, bench_fleet, example_run, run_manifests

__all__ = [
    "EXAMPLE", "IDLE_CAUSES", "MANAGED", "NAMESPACE", "SATURATED", "TARGETS", "CpuSampler", "Observer", "PodTimes",
    "Reaction", "Report", "apiserver_requests", "audit", "bench_fleet", "cpu_jiffies", "example_run",
    "gpu_busy_seconds", "gpu_utilisation", "idle_breakdown", "job_controller_delays", "job_trials", "main",
    "pod_waits", "proc_cpu_seconds", "proc_peak_rss", "quantile", "quantiles", "reaction_latencies",
    "reactions_by_load", "revision", "run_benchmark", "run_manifests", "start_profiler", "steady_window",
    "summarise_profile", "termination_message", "trials_per_pod", "utilisation",
]
