"""The report of `fleettune bench load`: every figure, marked against its target (`TARGETS`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fleettune_dev.bench.load.analysis import SATURATED

TARGETS = {"p99_latency_s": 2.0, "utilisation": 0.90, "rss_bytes": 1 << 30, "object_bytes": 64 << 10}


@dataclass
class Report:
    gpus: int
    pools: int
    runs: int
    budget_per_target: int
    parallelism: int
    strategy: str
    trial_seconds: float
    trials_per_pod: int = 1
    pod_startup: bool = False
    trials_recorded: int = 0
    evaluations: int = 0  # records stored: one per configuration evaluated (infrastructure failures included)
    infra_failures: int = 0
    wall_s: float = 0.0
    trials_per_minute: float = 0.0
    latency_p50_s: float = float("nan")
    latency_p99_s: float = float("nan")
    latency_by_pool: dict[str, dict[str, float]] = field(default_factory=dict)
    latency_by_load: dict[str, dict[str, float]] = field(default_factory=dict)  # "saturated" / "not saturated"
    machine_busy: float = float("nan")  # mean busy share of all cores over the run
    machine_saturated: float = float("nan")  # share of the run with the machine saturated
    component_cpu_s: dict[str, float] = field(default_factory=dict)  # control-plane component -> CPU seconds
    job_controller_p50_s: float = float("nan")
    job_controller_p99_s: float = float("nan")
    job_controller_n: int = 0
    ahead_of_job_controller: int = 0
    scheduling_p50_s: float = float("nan")
    scheduling_p99_s: float = float("nan")
    starting_p50_s: float = float("nan")
    starting_p99_s: float = float("nan")
    unschedulable_pods: int = 0
    utilisation: float = 0.0
    utilisation_steady: float = 0.0
    idle_steady: dict[str, float] = field(default_factory=dict)  # cause -> share of GPU-seconds
    operator_cpu_s: float = 0.0
    operator_cpu_share: float = 0.0
    harness_cpu_s: float = 0.0  # this process: the fleet simulator and the observers
    operator_peak_rss_bytes: int = 0
    api_requests_per_s: float = 0.0
    api_requests_per_evaluation: float = float("nan")
    gpu_busy_s: float = 0.0
    gpu_allocated_s: float = 0.0
    gpu_utilisation: float = float("nan")
    api_top: list[tuple[str, float]] = field(default_factory=list)
    largest_run_bytes: int = 0
    suggestion_s: float = 0.0
    finished: bool = False
    audit: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    profile: list[str] = field(default_factory=list)

    def render(self) -> str:
        def mark(ok: bool) -> str:
            return "ok" if ok else "MISSED"

        gib = self.operator_peak_rss_bytes / (1 << 30)
        lines = [
            f"fleettune bench load: {self.gpus} GPUs in {self.pools} pools, {self.runs} runs × {self.pools} pools "
            f"× {self.budget_per_target} trials (parallelism {self.parallelism}, {self.strategy}, "
            f"~{self.trial_seconds:g} s per trial, {self.trials_per_pod} per Pod, "
            f"Pod start-up {'modelled' if self.pod_startup else 'not modelled'})",
            f"  finished:            {'yes' if self.finished else 'NO (timed out)'} in {self.wall_s:.0f} s",
            f"  trials recorded:     {self.trials_recorded} ({self.infra_failures} infrastructure failures)",
            f"  trials per minute:   {self.trials_per_minute:.0f}",
            f"  reaction p50 / p99:  {self.latency_p50_s:.2f} s / {self.latency_p99_s:.2f} s   "
            f"(target p99 < 2 s: {mark(self.latency_p99_s < TARGETS['p99_latency_s'])})",
        ]
        for pool, q in sorted(self.latency_by_pool.items()):
            lines.append(f"    {pool:<18} p50 {q['p50']:.2f} s  p99 {q['p99']:.2f} s  n={int(q['n'])}")
        for load, q in self.latency_by_load.items():
            lines.append(f"    machine {load + ':':<14} p50 {q['p50']:.2f} s  p99 {q['p99']:.2f} s  n={int(q['n'])}")
        lines.append(f"    Pod end → Job Complete/Failed (the Job controller; the operator reads the Pod instead): "
                     f"p50 {self.job_controller_p50_s:.2f} s, p99 {self.job_controller_p99_s:.2f} s "
                     f"(n={self.job_controller_n}; {self.ahead_of_job_controller} Jobs deleted before)")
        lines += [
            f"  fleet utilisation:   {self.utilisation:.1%} overall, {self.utilisation_steady:.1%} steady state   "
            f"(target > 90 %: {mark(self.utilisation_steady > TARGETS['utilisation'])})",
            f"    Pod created → bound p50 {self.scheduling_p50_s:.2f} s, p99 {self.scheduling_p99_s:.2f} s; "
            f"bound → Running p50 {self.starting_p50_s:.2f} s, p99 {self.starting_p99_s:.2f} s; "
            f"{self.unschedulable_pods} Pods found their pool full",
            "    idle GPU time in the steady state: " + ", ".join(
                f"{share:.1%} {cause}" for cause, share in self.idle_steady.items()),
            f"  GPU utilisation:     {self.gpu_utilisation:.2%} (evaluations' GPU time {self.gpu_busy_s:.0f} s "
            f"of {self.gpu_allocated_s:.0f} s held by trial Pods)",
            f"  operator CPU:        {self.operator_cpu_s:.0f} s ({self.operator_cpu_share:.0%} of one core); "
            f"the benchmark's own (simulator, observers): {self.harness_cpu_s:.0f} s",
            f"  machine CPU:         {self.machine_busy:.0%} busy ({os.cpu_count()} cores), saturated "
            f"(≥ {SATURATED:.0%}) {self.machine_saturated:.0%} of the run; control plane CPU: " + ", ".join(
                f"{name} {sec:.0f} s" for name, sec in self.component_cpu_s.items()),
            f"  operator peak RSS:   {gib:.2f} GiB   "
            f"(target < 1 GiB: {mark(self.operator_peak_rss_bytes < TARGETS['rss_bytes'])})",
            f"  suggestion time:     {self.suggestion_s:.1f} s in total (operator metrics)",
            f"  API requests/s:      {self.api_requests_per_s:.1f} (all clients); "
            f"{self.api_requests_per_evaluation:.1f} per evaluation ({self.evaluations} evaluations)",
            "    busiest: " + ", ".join(f"{k} {v:.1f}/s" for k, v in self.api_top[:6]),
            f"  largest TuningRun:   {self.largest_run_bytes / 1024:.1f} KiB   "
            f"(target < 64 KiB: {mark(self.largest_run_bytes < TARGETS['object_bytes'])})",
            f"  audit:               {'no trial lost or duplicated' if not self.audit else 'FAILED'}",
        ]
        lines += [f"    - {p}" for p in self.audit[:20]]
        if self.profile:
            lines.append("  where the operator's CPU goes (py-spy, inclusive share of samples):")
            lines += [f"    {p}" for p in self.profile]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
