"""How many configurations a batched Pod takes (issue #16): the planner's batch-size rule.

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

__all__ = ["batch_size"]


def batch_size(measured_seconds: Sequence[float], pod_seconds: float, max_batch: int, remaining: int) -> int:
    """The number of configurations the next Pod of one target should take.

    ``measured_seconds``: GPU seconds (verification + benchmark) of the target's
    configurations measured so far, any order. Values that are not finite or not positive
    are ignored: a configuration that never reached the GPU says nothing about how long
    one that does will take.
    ``pod_seconds``: the GPU time a Pod should aim at (> 0).
    ``max_batch``: the most configurations one Pod may take (>= 1).
    ``remaining``: evaluations left in the budget.

    Returns ``floor(pod_seconds / median(measured))`` clamped to ``[1, max_batch]`` and to
    ``remaining``; 1 while nothing usable has been measured (the first Pod of a target
    measures one configuration alone); 0 when ``remaining <= 0``. The median, not the
    mean: one pathological configuration (a kernel 100x slower than its neighbours) must
    not shrink every later Pod. Floor, not round: a Pod aims at most at ``pod_seconds``.

    Raises ``ValueError`` for a non-positive or non-finite ``pod_seconds`` or a
    ``max_batch`` below 1.
    """
    if not (math.isfinite(pod_seconds) and pod_seconds > 0):
        raise ValueError(f"pod_seconds must be a positive number, got {pod_seconds!r}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch!r}")
    if remaining <= 0:
        return 0
    usable = [float(s) for s in measured_seconds if math.isfinite(s) and s > 0]
    if not usable:
        return 1
    per_config = statistics.median(usable)
    # A ratio beyond max_batch would be clamped anyway; comparing first avoids an
    # overflow to int of an absurd ratio (a measured time of 1e-300 s).
    ratio = pod_seconds / per_config
    k = max_batch if ratio >= max_batch else math.floor(ratio)
    return max(1, min(k, max_batch, remaining))
