"""The batch-size rule of batched Pods (fleettune.optimize.batching.batch_size)."""

from __future__ import annotations

import math
import statistics

import pytest

from fleettune.optimize.batching import FIRST_CONFIGS, batch_size


def test_nothing_measured_takes_the_first_blind_picks_over_the_pods() -> None:
    assert batch_size([], 60.0, 16, 100) == FIRST_CONFIGS
    # Nothing usable: failures that never reached the GPU report 0 or nan.
    assert batch_size([0.0, math.nan, -1.0, math.inf], 60.0, 16, 100) == FIRST_CONFIGS
    assert batch_size([], 60.0, 16, 100, pods=4) == FIRST_CONFIGS // 4
    assert batch_size([], 60.0, 16, 100, pods=4 * FIRST_CONFIGS) == 1  # at least one each
    assert batch_size([], 60.0, 3, 100) == 3 and batch_size([], 60.0, 16, 2) == 2  # within the limits


# A start-up that always pays to amortise: the aim alone decides.
SLOW_START = math.inf


@pytest.mark.parametrize("per_config", [4.0, 5.9, 7.5, 13.0, 59.0, 61.0, 600.0])
def test_aims_at_the_pod_duration(per_config: float) -> None:
    k = batch_size([per_config], 60.0, 1000, 1000, startup_s=SLOW_START)
    # The largest batch whose estimated GPU time stays within the aim (at least one).
    assert k >= 1
    assert k == 1 or k * per_config <= 60.0
    assert (k + 1) * per_config > 60.0


def test_uses_the_median_of_what_was_measured() -> None:
    measured = [2.0, 2.5, 3.0, 400.0, 0.0]  # one pathological configuration, one failure
    median = statistics.median([2.0, 2.5, 3.0, 400.0])
    assert batch_size(measured, 30.0, 100, 100, startup_s=SLOW_START) == math.floor(30.0 / median)
    # Order does not matter.
    assert batch_size(list(reversed(measured)), 60.0, 100, 100) == batch_size(measured, 60.0, 100, 100)


def test_clamped_to_max_batch_and_remaining_budget() -> None:
    assert batch_size([0.01], 60.0, 16, 100) == 16
    assert batch_size([0.01], 60.0, 16, 5) == 5
    assert batch_size([1e-300], 60.0, 16, 100) == 16  # no overflow
    assert batch_size([1000.0], 60.0, 16, 100) == 1
    assert batch_size([1.0], 60.0, 16, 0) == 0
    assert batch_size([1.0], 60.0, 16, -3) == 0
    assert batch_size([], 60.0, 1, 10) == 1


def test_monotone_in_the_aim_and_in_the_measured_time() -> None:
    sizes = [batch_size([2.0], s, 64, 1000) for s in (1.0, 5.0, 10.0, 30.0, 60.0, 120.0)]
    assert sizes == sorted(sizes)
    sizes = [batch_size([t], 60.0, 64, 1000) for t in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("pod_seconds", [0.0, -1.0, math.nan, math.inf])
def test_rejects_a_meaningless_aim(pod_seconds: float) -> None:
    with pytest.raises(ValueError, match="pod_seconds"):
        batch_size([1.0], pod_seconds, 16, 10)


def test_rejects_max_batch_below_one() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        batch_size([1.0], 60.0, 0, 10)


def test_pods_of_a_target_share_the_outstanding_configurations() -> None:
    from fleettune.optimize.batching import MAX_OUTSTANDING

    assert batch_size([0.01], 60.0, 16, 1000, pods=1) == min(16, MAX_OUTSTANDING)
    assert batch_size([0.01], 60.0, 16, 1000, pods=4) == MAX_OUTSTANDING // 4
    assert batch_size([0.01], 60.0, 64, 1000, pods=1) == MAX_OUTSTANDING
    assert batch_size([0.01], 60.0, 16, 1000, pods=64) == 1  # never fewer than one each
    with pytest.raises(ValueError):
        batch_size([0.01], 60.0, 16, 10, pods=0)


def test_long_configurations_are_batched_only_to_amortise_the_start_up() -> None:
    from fleettune.optimize.batching import STARTUP_SHARE

    # 3 s of GPU work each: 20 would fill a minute, but 4 make a 2 s start-up ≤ 20 % of the Pod.
    k = batch_size([3.0], 60.0, 16, 1000, startup_s=2.0)
    assert k == math.ceil(2.0 / (STARTUP_SHARE * 3.0)) == 4
    # Short configurations still fill the Pod: the start-up share is not what limits them.
    assert batch_size([0.05], 60.0, 16, 1000, startup_s=2.0) == 16


def test_slow_start_keeps_what_is_outstanding_within_half_the_results() -> None:
    from fleettune.optimize.batching import slow_start

    assert slow_start(16, observed=0, outstanding=0) == 1  # every free GPU still gets work
    assert slow_start(16, observed=0, outstanding=3) == 1
    assert slow_start(16, observed=3, outstanding=0) == 1
    assert slow_start(16, observed=20, outstanding=4) == 6
    assert slow_start(16, observed=21, outstanding=4) == 6  # half of 21, rounded down
    assert slow_start(16, observed=100, outstanding=34) == 16  # the size asked for, once results allow
    assert slow_start(16, observed=100, outstanding=35) == 15
    assert slow_start(1, observed=100, outstanding=0) == 1
