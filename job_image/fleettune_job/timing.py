"""Timing a kernel: warm-ups, repeats, an optional minimum total duration, statistics.

The loop is written against a ``Timer`` (a callable that runs one launch and returns its
duration in ms) so that its rules are testable without a GPU; :func:`cuda_event_timer`
is the real one, using CUDA events on the launch stream.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fleettune_job.protocol import PRUNE_RUNS

Launch = Callable[[], None]
Timer = Callable[[Launch], float]

# Short kernels with a minimum duration could otherwise loop for a very long time.
MAX_REPEATS = 10_000
# Times sent back in the result: enough to show the spread, small enough for 4 KiB.
REPORTED_TIMES = 32


@dataclass(frozen=True)
class Stats:
    count: int
    median: float
    mean: float
    minimum: float
    maximum: float
    stdev: float
    iqr: float
    total_ms: float

    @property
    def relative_spread(self) -> float:
        """Interquartile range over median: how noisy the measurement was."""
        return self.iqr / self.median if self.median > 0 else math.inf

    def line(self) -> str:
        return (
            f"n={self.count} median={self.median:.5g} ms min={self.minimum:.5g} max={self.maximum:.5g} "
            f"iqr={self.iqr:.3g} ({100 * self.relative_spread:.2f}%) stdev={self.stdev:.3g}"
        )


def summarize(times_ms: list[float]) -> Stats:
    if not times_ms:
        raise ValueError("no times to summarize")
    ordered = sorted(times_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return Stats(
        count=len(ordered),
        median=statistics.median(ordered),
        mean=statistics.fmean(ordered),
        minimum=ordered[0],
        maximum=ordered[-1],
        stdev=statistics.stdev(ordered) if len(ordered) >= 2 else 0.0,
        iqr=q3 - q1,
        total_ms=math.fsum(ordered),
    )


def can_prune(repeats: int, prune_above_ms: float | None, prune_runs: int = PRUNE_RUNS) -> bool:
    """Whether a configuration asked for ``repeats`` timed launches may be pruned."""
    return prune_above_ms is not None and repeats > prune_runs


def pruned_after(first_ms: Sequence[float], repeats: int, prune_above_ms: float | None,
                 prune_runs: int = PRUNE_RUNS) -> bool:
    """Whether timing stops after these first launches (ms): more than ``prune_runs`` are
    asked for and the median of the first ``prune_runs`` is above ``prune_above_ms``. The
    one rule that the job, the fleet simulator and the timeline replay apply.

    The median, not the mean: it is what a pruned configuration reports, so with a cut-off
    at or above the pool's best time (`kernel.pruneSlowerThan` is 0 or at least 1) a pruned
    configuration reports a time above the best and can never become the best; and one
    slow launch (a cold cache) prunes nothing."""
    if prune_above_ms is None or not can_prune(repeats, prune_above_ms, prune_runs) or len(first_ms) < prune_runs:
        return False
    return statistics.median(first_ms[:prune_runs]) > prune_above_ms


def measure(
    launch: Launch,
    timer: Timer,
    *,
    warmups: int,
    repeats: int,
    min_duration_s: float = 0.0,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    max_repeats: int = MAX_REPEATS,
    prune_above_ms: float | None = None,
    prune_runs: int = PRUNE_RUNS,
    verify: Callable[[], None] | None = None,
) -> list[float]:
    """Run ``warmups`` untimed launches, then timed ones until both ``repeats`` launches
    and ``min_duration_s`` of kernel time are reached.

    Extra launches for the minimum duration stop at ``deadline`` (a ``clock()`` value) so
    that a trial returns its measurement instead of running into its own timeout; the
    requested ``repeats`` always run, unless pruned (`pruned_after`): then only the first
    ``prune_runs`` (so fewer times than ``repeats`` means pruned).

    ``verify`` (checking the configuration's output; it raises for a wrong one) runs once,
    before any launch when nothing can be pruned, else once the first ``prune_runs`` did
    not prune (followed by the warm-ups again): a pruned configuration cannot become the
    best, so its output does not matter, and verification costs GPU time (a reference
    computation) that would otherwise be most of a pruned configuration's.
    """
    prunable = can_prune(repeats, prune_above_ms, prune_runs)
    deferred = verify if prunable else None
    if verify is not None and not prunable:
        verify()
    for _ in range(warmups):
        timer(launch)
    times: list[float] = []
    total_s = 0.0
    while len(times) < repeats or (total_s < min_duration_s and len(times) < max_repeats):
        if len(times) >= repeats and deadline is not None and clock() >= deadline:
            break
        if prunable and len(times) == prune_runs:
            if pruned_after(times, repeats, prune_above_ms, prune_runs):
                break
            if deferred is not None:
                deferred()
                deferred = None
                # The check left the GPU idle (a reference computation, maybe its compile):
                # warm it up again, as before the first timed launch.
                for _ in range(warmups):
                    timer(launch)
        elapsed = timer(launch)
        times.append(elapsed)
        total_s += elapsed / 1000.0
    return times


def reported(times_ms: list[float], limit: int = REPORTED_TIMES) -> list[float]:
    """At most ``limit`` times, evenly sampled in order, rounded to 6 significant digits."""
    if len(times_ms) > limit:
        step = len(times_ms) / limit
        times_ms = [times_ms[int(i * step)] for i in range(limit)]
    return [float(f"{t:.6g}") for t in times_ms]


def cuda_event_timer(cupy: Any, stream: Any = None) -> Timer:
    """A timer that brackets each launch with CUDA events on ``stream``.

    Events measure GPU time between the two records, unaffected by Python overhead
    between launches; synchronising on the end event after every launch keeps launches
    from overlapping, so each time is one kernel.
    """
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    start = cupy.cuda.Event()
    end = cupy.cuda.Event()

    def time_one(launch: Launch) -> float:
        start.record(stream)
        launch()
        end.record(stream)
        end.synchronize()
        return float(cupy.cuda.get_elapsed_time(start, end))

    return time_one
