"""How many configurations a batched Pod takes: the planner's batch-size rule.

A batched Pod pays one Pod start-up and one CUDA/interpreter start for all its
configurations, so longer Pods spread that cost thinner; but the study only learns from a
Pod when it ends, so very long Pods make the search wait (and widen the set of
configurations chosen without each other's results). The rule aims every Pod at about
``pod_seconds`` of GPU work, estimated from what the target's configurations have cost
on the GPU so far.

Pure: no I/O, no clock, no state; the operator's planner and `fleettune bench timeline`
call the same function.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["batch_size", "queue_slots", "slow_start"]


# Configurations of one pool chosen without each other's results, all Pods together: 8 per
# Pod on four GPUs. More blind picks cost evaluations, fewer cost start-ups; since the
# operator reads each answer as it is printed, 32 beat 16, 24 and 64 on four GPUs in
# `fleettune bench timeline` (docs/benchmarks.md). A one-GPU pool is held by the batch
# cap (16) instead.
MAX_OUTSTANDING = 32
# A batch is only as large as it takes for the Pod's start-up to cost at most this share of
# its GPU work: past that, a longer batch saves little and delays the results the search
# learns from (configurations of seconds each: dedispersion in docs/benchmarks.md).
STARTUP_SHARE = 0.2
STARTUP_S = 2.0  # a Pod's start-up and CUDA start, median (Kubernetes' own SLO: p99 5 s)
# A ramping target's outstanding configurations stay within this share of its results: at
# a half, batches of 16 on four GPUs search within 0.003 of one at a time at 100
# evaluations (0.016 at a share of 1), for 34 Pods instead of 23 (docs/decisions.md).
RAMP_SHARE = 0.5
# With nothing measured yet, a target's first Pods take this many configurations between
# them. What a strategy picks before its first result (a space-filling design, a first
# population, random draws) is blind anyway, and the operator reads each answer as it is
# printed, so a longer first Pod holds back no result; it saves the start-ups of the Pods
# that would otherwise measure them one by one. 8 beat 4 and one at a time in
# `fleettune bench timeline` (docs/decisions.md).
FIRST_CONFIGS = 8


def batch_size(measured_seconds: Sequence[float], pod_seconds: float, max_batch: int, remaining: int,
               *, pods: int = 1, startup_s: float = STARTUP_S) -> int:
    """The number of configurations the next Pod of one target should take.

    ``measured_seconds``: GPU seconds (verification + benchmark) of the target's
    configurations measured so far, any order. Values that are not finite or not positive
    are ignored: a configuration that never reached the GPU says nothing about how long
    one that does will take.
    ``pod_seconds``: the GPU time a Pod should aim at (> 0).
    ``max_batch``: the most configurations one Pod may take (>= 1).
    ``remaining``: evaluations left in the budget.
    ``pods``: Pods of the target that run at once (its parallelism): together they hold
    at most MAX_OUTSTANDING configurations (never fewer than one each).
    ``startup_s``: a Pod's start-up; a batch needs no more configurations than make it
    at most STARTUP_SHARE of the Pod's GPU work.

    Returns ``floor(pod_seconds / median(measured))`` clamped to those limits, to
    ``[1, max_batch]`` and to ``remaining``; while nothing usable has been measured,
    FIRST_CONFIGS over the ``pods`` (at least one each); 0 when ``remaining <= 0``. The
    median, not the mean: one pathological configuration (a kernel 100x slower than its
    neighbours) must not shrink every later Pod. Floor, not round: a Pod aims at most at
    ``pod_seconds``.

    Raises ``ValueError`` for a non-positive or non-finite ``pod_seconds`` or a
    ``max_batch`` or ``pods`` below 1.
    """
    if not (math.isfinite(pod_seconds) and pod_seconds > 0):
        raise ValueError(f"pod_seconds must be a positive number, got {pod_seconds!r}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch!r}")
    if pods < 1:
        raise ValueError(f"pods must be at least 1, got {pods!r}")
    if remaining <= 0:
        return 0
    usable = [float(s) for s in measured_seconds if math.isfinite(s) and s > 0]
    limit = min(max_batch, max(1, MAX_OUTSTANDING // pods))
    if not usable:
        return max(1, min(FIRST_CONFIGS // pods, limit, remaining))
    per_config = statistics.median(usable)
    # Ratios beyond the limit are clamped anyway; comparing first avoids an overflow to
    # int of an absurd ratio (a measured time of 1e-300 s).
    ratio = pod_seconds / per_config
    k = limit if ratio >= limit else math.floor(ratio)
    enough = startup_s / (STARTUP_SHARE * per_config)
    if enough < limit:
        k = min(k, math.ceil(enough))
    return max(1, min(k, limit, remaining))


def slow_start(k: int, observed: int, outstanding: int) -> int:
    """``k`` capped so that a target's outstanding configurations (``outstanding``, the
    ones already in its Pods, plus this Pod's) stay within RAMP_SHARE of its results
    (``observed``); never below 1, so that every free GPU gets work.

    A Pod's configurations are all chosen before any of them is measured, and a study
    suggests well only from results: with nothing measured, a batch is a space-filling
    design, and on four GPUs with 16 per Pod the first 64 configurations would be chosen
    blind. Ramping up as results arrive (as TCP's slow start) costs a few short Pods at the
    start of a target and keeps batched search close to sequential search per evaluation
    (docs/decisions.md). The planner ramps fixed sizes
    (`budget.trialsPerPod`) only: `batch_size` keeps a pool within MAX_OUTSTANDING
    already, where the ramp's extra start-ups cost more wall-clock than its better
    suggestions save.
    """
    return max(1, min(k, math.floor(RAMP_SHARE * observed) - outstanding))


def queue_slots(free: int, admitted: int, waiting: int) -> int:
    """How many new Jobs a pool behind a Kueue queue may create now: at most ``free`` (its
    parallelism left), and never more waiting for admission than it has admitted (at least
    one), so that a queue's quota, not the pool's parallelism, bounds what piles up in it.

    A waiting Job holds configurations chosen before the results that arrive while it waits:
    a pool whose quota admits two Jobs at a time gains nothing from eight in the queue, and
    its suggestions would go stale. As with `slow_start`, admission grows the pool's share
    (1, 2, 4, ... Jobs) until the queue stops admitting or the parallelism is reached.
    """
    return max(0, min(free, max(1, admitted) - waiting))
