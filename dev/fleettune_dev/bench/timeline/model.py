"""The fleet model of `fleettune bench timeline`, the recorded spaces it replays, and one
run's result on the simulated clock.

`FleetModel`: what the fleet modes assume besides the recording (Pod start-ups, compile
processes, batch sizes, answer streaming, pruning). `TimedSpace`: a Kernel Tuner cache with
what each configuration cost when it was recorded. `Run`: what one (space, mode, GPUs,
seed) replay produced, as the simulator and the Kernel Tuner driver both report it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleettune.api import KernelSpec
from fleettune_dev.bench.strategy import Replay
from fleettune_dev.sim.startup import PodStartup
from fleettune_job.ahead import MAX_COMPILE_WORKERS

KT_PREFIX = "kernel_tuner:"  # a mode that runs Kernel Tuner's own strategy
FLEET_MODES = ("pod", "batch")  # the modes the discrete-event simulator replays
PRUNE_SLOWER_THAN: float = KernelSpec.model_fields["prune_slower_than"].default  # the operator's default


@dataclass(frozen=True)
class FleetModel:
    """What the fleet modes assume besides the recording (docs/benchmarks.md)."""

    startup: PodStartup = field(default_factory=PodStartup)
    # Compile processes of a batched Pod: what the job image runs on a node with cores to
    # spare (one per core but one, at most MAX_COMPILE_WORKERS).
    cpus: int = MAX_COMPILE_WORKERS
    pod_seconds: float = 60.0  # GPU time a batched Pod aims at
    max_batch: int = 16
    # Kernel Tuner's per-configuration overhead (argument set-up, cache writes) is not in
    # the model of a Pod; this adds it to every configuration's GPU time to see
    # how much the comparison leans on leaving it out.
    framework_on_gpu: bool = False
    # The operator reads the answers a running batched Pod prints (the job image's
    # ``fleettune-answer`` log lines) and steps at every Pod end and at least every this many
    # seconds (0: at each answer, as the operator does: it follows the Pods' logs). None:
    # it learns a Pod's answers when the Pod ends (its termination message; the operator
    # with ``FLEETTUNE_FOLLOW_ANSWERS=0``, or before it followed logs).
    stream_poll_s: float | None = 0.0
    # The operator's pruning (`kernel.pruneSlowerThan`): a configuration whose first
    # PRUNE_RUNS recorded runs have a median over this factor times the best time known when
    # its Pod was created is timed no further and not verified (those runs' share of its
    # recorded benchmark time is spent), and the study observes its time from those runs
    # (`observe_recorded`). 0: off.
    prune_slower_than: float = PRUNE_SLOWER_THAN

    def __post_init__(self) -> None:
        if self.cpus < 1:
            raise ValueError(f"cpus must be at least 1, got {self.cpus}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {self.max_batch}")
        if not self.pod_seconds > 0:
            raise ValueError(f"pod_seconds must be positive, got {self.pod_seconds}")
        if self.prune_slower_than != 0 and not self.prune_slower_than >= 1:
            raise ValueError(f"prune_slower_than must be 0 (off) or >= 1, got {self.prune_slower_than}")
        if self.stream_poll_s is not None and not self.stream_poll_s >= 0:
            raise ValueError(f"stream_poll_s must be >= 0, got {self.stream_poll_s}")


@dataclass
class TimedSpace:
    """A recorded space with what each configuration cost when it was recorded (seconds)."""

    replay: Replay
    compile_s: np.ndarray
    verify_s: np.ndarray
    bench_s: np.ndarray
    framework_s: np.ndarray
    path: Path | None = None
    # Kernel Tuner's view of the same file: parameter order, and candidate number by the
    # tuple of parameter values (to place what Kernel Tuner evaluated).
    keys: list[str] = field(default_factory=list)
    index_of: dict[tuple[Any, ...], int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.replay.name

    @property
    def compile_failed(self) -> np.ndarray:
        return np.array([f == "compile" for f in self.replay.failure])

    def gpu_s(self, framework_on_gpu: bool = False) -> np.ndarray:
        """GPU critical-path seconds of each configuration (0 where the build failed)."""
        g = self.verify_s + self.bench_s + (self.framework_s if framework_on_gpu else 0.0)
        return np.where(self.compile_failed, 0.0, g)


def _seconds(records: Sequence[Any], name: str) -> np.ndarray:
    out = np.zeros(len(records))
    for i, r in enumerate(records):
        v = r.extras.get(name)
        if isinstance(v, int | float) and math.isfinite(v) and v > 0:
            out[i] = float(v) / 1000.0  # Kernel Tuner records milliseconds
    return out


def load_timed_space(path: str | Path) -> TimedSpace:
    """A Kernel Tuner cache with its recorded costs; ValueError when it records none."""
    from fleettune_dev.interop import read_kernel_tuner_cache

    rec = read_kernel_tuner_cache(path)
    replay = Replay(
        name=Path(path).name,
        space=rec.space,
        rows=np.asarray(rec.rows, dtype=np.int32),
        time_ms=np.array([np.nan if r.time_ms is None else float(r.time_ms) for r in rec.records]),
        failure=[r.failure for r in rec.records],
        times=[list(r.times or []) for r in rec.records],
        path=Path(path),
    )
    costs = {k: _seconds(rec.records, k) for k in ("compile_time", "verification_time", "benchmark_time",
                                                    "framework_time")}
    if not any(c.any() for c in costs.values()):
        raise ValueError(f"{path}: records no compile/verification/benchmark times; nothing to put on a clock")
    keys = [p.name for p in rec.space.parameters]
    index_of = {tuple(r.config[k] for k in keys): i for i, r in enumerate(rec.records)}
    return TimedSpace(replay, costs["compile_time"], costs["verification_time"], costs["benchmark_time"],
                      costs["framework_time"], Path(path), keys, index_of)


@dataclass
class Run:
    """One (space, mode, GPUs, seed) run on the simulated clock."""

    space: str
    mode: str
    gpus: int
    seed: int
    times: np.ndarray  # (n,) when each evaluation's result was known, observation order
    values: np.ndarray  # (n,) its time in ms, nan where it failed
    order: np.ndarray  # (n,) its candidate number (index into the recording)
    spans: list[tuple[float, float]]  # GPU allocations (start, end), in-flight ones included
    end: float  # when the run stopped (budget spent, or --stop-at reached)
    gpu_work: float = 0.0  # verification + benchmark seconds, finished work
    allocated: float = 0.0  # GPU seconds of finished Pods (Kernel Tuner: the run)
    startup: float = 0.0  # start-up seconds of finished Pods
    evaluated_gpu_s: float = 0.0  # recorded verification + benchmark of finished evaluations
    pods: int = 0  # finished Pods
    latency: float = 0.0  # seconds of suggestion/strategy time put on the clock
    batches: list[int] = field(default_factory=list)  # size of every finished Pod

    def gpu_seconds(self, until: float) -> float:
        return float(sum(max(0.0, min(e, until) - s) for s, e in self.spans if s < until))
